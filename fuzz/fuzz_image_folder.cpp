// ImageFolderDataset::load: a folder tree built from the input (class folders, nested folders,
// file names and image bytes), loaded cached and uncached, every sample read back.
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "core/data/image_folder_dataset.h"
#include "fuzz/fuzz_util.h"

using namespace batchpilot::core;

namespace {

/// A file or folder name from the input: letters, digits, '.', '_' and '-' only, never empty,
/// "." or "..".
std::string nameFrom(FuzzedDataProvider& input) {
    static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789._-";
    std::string name;
    const size_t length = input.ConsumeIntegralInRange<size_t>(1, 12);
    for (size_t i = 0; i < length; ++i)
        name += kAlphabet[input.ConsumeIntegralInRange<size_t>(0, sizeof kAlphabet - 2)];
    if (name == "." || name == "..") name = "x" + name;
    return name;
}

std::string imageName(FuzzedDataProvider& input) {
    static constexpr const char* kExtensions[] = {".png", ".jpg", ".bmp",  ".gif", ".tga",
                                                  ".pgm", ".ppm", ".JPEG", ".txt", ""};
    return nameFrom(input) + kExtensions[input.ConsumeIntegralInRange<size_t>(0, std::size(kExtensions) - 1)];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider input(data, size);
    const auto root = batchpilot::fuzz::freshFolder("images");
    DataOptions options;
    options.name = "image-folder";
    options.path = root.string();
    options.channels = input.ConsumeBool() ? 3 : 1;
    options.height = input.ConsumeIntegralInRange<int64_t>(1, 12);
    options.width = input.ConsumeIntegralInRange<int64_t>(1, 12);
    options.imageCacheBytes = input.ConsumeBool() ? (int64_t{1} << 20) : 0;

    const int classes = input.ConsumeIntegralInRange<int>(0, 3);
    for (int c = 0; c < classes && input.remaining_bytes() > 0; ++c) {
        const auto folder = root / nameFrom(input);
        std::error_code ec;
        std::filesystem::create_directories(folder, ec);
        const int files = input.ConsumeIntegralInRange<int>(0, 3);
        for (int f = 0; f < files && input.remaining_bytes() > 0; ++f) {
            auto where = folder;
            if (input.ConsumeBool()) {
                where /= nameFrom(input);
                std::filesystem::create_directories(where, ec);
            }
            if (!ec && !std::filesystem::is_directory(where / "x")) {
                const auto file = where / imageName(input);
                if (!std::filesystem::exists(file))
                    batchpilot::fuzz::writeFile(file, input.ConsumeRandomLengthString(4096));
            }
        }
    }

    const auto loaded = ImageFolderDataset::load(options);
    if (!loaded) {
        if (loaded.error().empty()) std::abort();
        return 0;
    }
    const auto& images = **loaded;
    if (images.size() < 1 || images.classes() < 1) std::abort();
    std::vector<int64_t> all(static_cast<size_t>(images.size()));
    std::iota(all.begin(), all.end(), 0);
    const Batch batch = images.get(all);
    if (batch.inputs.size(0) != images.size()) std::abort();
    if (batch.targets.max().item<int64_t>() >= images.classes()) std::abort();
    return 0;
}
