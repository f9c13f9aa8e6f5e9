// decodeImage: one image file (PNG, JPEG, BMP, GIF, TGA, PNM) decoded, converted and resized.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/data/image_folder_dataset.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    // The first byte chooses the output: grey or RGB, and a size to resize to (3 to 18 a side).
    const int64_t channels = (data[0] & 1) != 0 ? 3 : 1;
    const int64_t height = 3 + ((data[0] >> 1) & 15);
    const int64_t width = 3 + ((data[0] >> 4) & 15);
    static const auto file = batchpilot::fuzz::scratch() / "image";
    batchpilot::fuzz::writeFile(file, batchpilot::fuzz::asText(data + 1, size - 1));
    std::vector<uint8_t> out(static_cast<size_t>(channels * height * width));
    const auto decoded = batchpilot::core::decodeImage(file.string(), channels, height, width, out.data());
    if (!decoded && decoded.error().empty()) std::abort();
    return 0;
}
