// loadCheckpoint (--resume, the GUI's Resume): the input is the file checkpoint.pt, loaded into
// the model and optimizer the seed corpus was saved from (the CLI's MLP of width 8 on 1x4x4 images,
// 2 classes, SGD): BatchPilot's header, length and CRC-32 checks, which every damaged file meets.
//
// With BATCHPILOT_FUZZ_PAST_CHECKSUM=1 in the environment and an odd first byte, the rest of the
// input is wrapped in a header with the right length and CRC-32, so that LibTorch's archive
// reader is fuzzed too. A file that passes the checksum is trusted like a model file, and
// LibTorch's reader trusts the sizes inside: this mode found its unpickler allocating 4 GiB for a
// string length a 2 KiB file claims (docs/RELIABILITY.md), which is why scripts/fuzz leaves it off.
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/train/checkpoint.h"
#include "core/data/dataset.h"
#include "core/nn/model.h"
#include "core/nn/model_factory.h"
#include "core/optim/optimizer.h"
#include "fuzz/fuzz_util.h"

using namespace batchpilot::core;

namespace {

std::string withHeader(std::string_view payload) {
    std::string file = "BATCHPILOT-CKPT\n";  // core/train/checkpoint.cpp's kMagic
    uint64_t length = payload.size();
    for (int i = 0; i < 8; ++i) file += static_cast<char>((length >> (8 * i)) & 0xFF);
    const uint32_t crc = static_cast<uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()), static_cast<uInt>(payload.size())));
    for (int i = 0; i < 4; ++i) file += static_cast<char>((crc >> (8 * i)) & 0xFF);
    file += payload;
    return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    static const auto folder = batchpilot::fuzz::freshFolder("checkpoint");
    static const bool pastChecksum = std::getenv("BATCHPILOT_FUZZ_PAST_CHECKSUM") != nullptr &&
                                     std::string_view(std::getenv("BATCHPILOT_FUZZ_PAST_CHECKSUM")) == "1";
    const auto text = batchpilot::fuzz::asText(data + 1, size - 1);
    batchpilot::fuzz::writeFile(folder / kCheckpointFile,
                                pastChecksum && (data[0] & 1) != 0 ? withHeader(text) : std::string(text));

    DataOptions shape;
    shape.samples = 8;
    shape.channels = 1;
    shape.height = shape.width = 4;
    shape.classes = 2;
    static const SyntheticImages images(shape);
    ModelOptions mlp;
    mlp.name = "mlp";
    mlp.width = 8;
    auto model = makeModel(mlp, images);
    if (!model) std::abort();
    Optimizer optimizer(OptimizerOptions{}, (*model)->parameters());
    const auto loaded = loadCheckpoint(folder.string(), **model, optimizer);
    if (!loaded && loaded.error().empty()) std::abort();
    return 0;
}
