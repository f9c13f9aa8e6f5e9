// MnistDataset::load on plain IDX files: the input holds both files (labels first, then images).
#include <cstdint>
#include <cstdlib>

#include <fuzzer/FuzzedDataProvider.h>

#include "core/data/mnist_dataset.h"
#include "fuzz/fuzz_util.h"

using batchpilot::core::MnistDataset;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider input(data, size);
    const auto folder = batchpilot::fuzz::freshFolder("mnist");
    const std::string labels = input.ConsumeRandomLengthString(size);
    batchpilot::fuzz::writeFile(folder / "train-labels-idx1-ubyte", labels);
    batchpilot::fuzz::writeFile(folder / "train-images-idx3-ubyte", input.ConsumeRemainingBytesAsString());
    const auto loaded = MnistDataset::load(folder.string());
    if (!loaded) {
        if (loaded.error().empty()) std::abort();
        return 0;
    }
    const auto& mnist = **loaded;
    if (mnist.size() < 1 || mnist.classes() < 1) std::abort();
    const auto batch = mnist.get({0, mnist.size() - 1});
    if (batch.targets.max().item<int64_t>() >= mnist.classes()) std::abort();
    return 0;
}
