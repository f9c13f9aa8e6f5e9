#include "core/config/memory_savers.h"

namespace batchpilot::core {

bool checkpoints(MemorySavers savers) {
    return savers == MemorySavers::Checkpoint || savers == MemorySavers::Both || savers == MemorySavers::CheckpointFp16;
}

bool autocastsBf16(MemorySavers savers) {
    return savers == MemorySavers::Bf16 || savers == MemorySavers::Both;
}

bool autocastsFp16(MemorySavers savers) {
    return savers == MemorySavers::Fp16 || savers == MemorySavers::CheckpointFp16;
}

std::string describeSavers(MemorySavers savers) {
    const std::string autocast = autocastsBf16(savers)   ? "bfloat16 autocast"
                                 : autocastsFp16(savers) ? "float16 autocast with loss scaling"
                                                         : "";
    if (checkpoints(savers) && !autocast.empty()) return "activation checkpointing and " + autocast;
    if (checkpoints(savers)) return "activation checkpointing";
    if (!autocast.empty()) return autocast;
    return "no memory saver";
}

}  // namespace batchpilot::core
