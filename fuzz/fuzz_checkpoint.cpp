// loadCheckpoint (--resume, the GUI's Resume): the input is the file checkpoint.pt, loaded into
// the model and optimizer the seed corpus was saved from (the CLI's MLP of width 8 on 1x4x4 images,
// 2 classes, SGD): BatchPilot's header, length and CRC-32 checks, which every damaged file meets.
//
// With BATCHPILOT_FUZZ_PAST_CHECKSUM=1 in the environment and an odd first byte, the rest of the
// input is wrapped in a header with the right length and CRC-32, so that LibTorch's archive
// reader is fuzzed too. A file that passes the checksum is trusted like a model file, and
// LibTorch's reader trusts the sizes inside: this mode found its unpickler allocating 4 GiB for a
// string length a 2 KiB file claims (docs/RELIABILITY.md), which is why scripts/fuzz leaves it off.
//
// A checkpoint that loads is held to what a run writes (checkLoaded): the seeds regress-edited-*
// are the seed checkpoint with one field edited by Python's torch (tests/app/edit_checkpoint.py),
// with a valid header, so that the fuzzer starts from fields past the checksum.
#include <zlib.h>

#include <cmath>
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

/// What a checkpoint that loads must hold, checked here apart from the reader's own checks: no
/// field out of the range a run writes, float32 finite weights, the optimizer's state one tensor
/// per parameter (or none) with a step count to go with it. A checkpoint edited by hand used to
/// load with any of these broken, and train on (issue 66).
void checkLoaded(const TrainerState& s, const Model& model, const Optimizer& optimizer) {
    const bool inRange = s.step >= 0 && s.samplesSeen >= 0 && s.samplerEpoch >= 0 && s.samplerPosition >= 0 &&
                         (s.trainingSamples < 0 || s.samplerPosition <= s.trainingSamples) && s.targetBatch >= 1 &&
                         s.targetBatch <= kMaxTargetBatch && s.microBatch >= 0 && std::isfinite(s.learningRate) &&
                         s.learningRate > 0 && optimizer.learningRate() == s.learningRate;
    if (!inRange) std::abort();
    for (const auto& p : model.parameters())
        if (p.scalar_type() != torch::kFloat || !torch::isfinite(p).all().item<bool>()) std::abort();
    const size_t parameters = model.parameters().size();
    const auto& first = optimizer.firstState();
    if (!first.empty() && (first.size() != parameters || optimizer.stepCount() < 1)) std::abort();
    for (size_t i = 0; i < first.size(); ++i)
        if (first[i].sizes() != model.parameters()[i].sizes()) std::abort();
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
    if (loaded) checkLoaded(*loaded, **model, optimizer);
    return 0;
}
