#include "core/train/failure_explanation.h"

#include "core/config/memory_savers.h"

namespace batchpilot::core {

bool needsTwoSamples(const std::string& message) {
    return message.find("Expected more than 1 value per channel when training") != std::string::npos;
}

std::string explainMicroBatchFailure(const MicroBatchFailure& f) {
    std::string message = f.message;
    if (f.size < 2 && f.largestMicroBatch < 2 && needsTwoSamples(message)) {
        message +=
            " (the model's BatchNorm cannot train on one sample, and micro-batches are limited to 1 "
            "here: allow at least 2 with --max-micro-batch and --target-batch)";
    }
    if (autocastsFp16(f.savers) && message.find("Half") != std::string::npos) {
        message += std::string(
                       " (under float16 autocast, the memory savers fp16, a layer of the model got "
                       "float16 inputs it cannot take with this LibTorch on this device; train with ") +
                   (f.checkpointingPossible ? "bf16 or --memory-savers checkpoint)" : "bf16 or --memory-savers off)");
    }
    if (autocastsBf16(f.savers) && message.find("BFloat16") != std::string::npos) {
        message += std::string(
                       " (under bfloat16 autocast, the memory saver bf16, a layer of the model got "
                       "inputs of two types, which this LibTorch rejects; LibTorch 2.1 and later "
                       "accept them in normalisations; here train without bf16, ") +
                   (f.checkpointingPossible ? "e.g. --memory-savers checkpoint)" : "--memory-savers off)");
    }
    return message;
}

}  // namespace batchpilot::core
