#include "core/memory_savers.h"

namespace batchpilot::core {

bool checkpoints(MemorySavers savers) {
    return savers == MemorySavers::Checkpoint || savers == MemorySavers::Both;
}

bool autocastsBf16(MemorySavers savers) {
    return savers == MemorySavers::Bf16 || savers == MemorySavers::Both;
}

std::string describeSavers(MemorySavers savers) {
    if (checkpoints(savers) && autocastsBf16(savers)) return "activation checkpointing and bfloat16 autocast";
    if (checkpoints(savers)) return "activation checkpointing";
    if (autocastsBf16(savers)) return "bfloat16 autocast";
    return "no memory saver";
}

}  // namespace batchpilot::core
