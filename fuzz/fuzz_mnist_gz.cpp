// Gzipped MNIST: the input is the bytes of train-images-idx3-ubyte.gz (next to a valid plain
// labels file for 4 images), read by MnistDataset::load and by readMaybeGzipped with a cap.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/data/mnist_dataset.h"
#include "fuzz/fuzz_util.h"

using namespace batchpilot::core;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const auto folder = [] {
        const auto f = batchpilot::fuzz::freshFolder("mnist-gz");
        const std::string labels{"\x00\x00\x08\x01\x00\x00\x00\x04\x00\x01\x02\x03", 12};
        batchpilot::fuzz::writeFile(f / "train-labels-idx1-ubyte", labels);
        return f;
    }();
    const auto images = folder / "train-images-idx3-ubyte.gz";
    batchpilot::fuzz::writeFile(images, batchpilot::fuzz::asText(data, size));

    const auto capped = readMaybeGzipped(images.string(), 4096);
    if (capped && capped->size() > 4097) std::abort();  // the cap is a promise: at most cap + 1
    if (!capped && capped.error().empty()) std::abort();

    const auto loaded = MnistDataset::load(folder.string());
    if (!loaded) {
        if (loaded.error().empty()) std::abort();
        return 0;
    }
    if ((*loaded)->size() != 4) std::abort();
    (*loaded)->get({0, 3});
    return 0;
}
