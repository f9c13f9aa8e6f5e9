#pragma once

// Memory savers (issue 15): what training may trade for device memory, as the option
// memory_savers (core/options.h) names it. The trainer applies them (trainer_memory.cpp):
// activation checkpointing through the model (Model::setCheckpointing, built on
// core/activation_checkpoint.h), bfloat16 autocast around the forward pass.

#include <string>

#include "core/options.h"

namespace batchpilot::core {

/// True when `savers` recompute activations in backward (checkpoint, both).
bool checkpoints(MemorySavers savers);
/// True when `savers` run the forward pass under bfloat16 autocast (bf16, both).
bool autocastsBf16(MemorySavers savers);
/// In words for messages: "activation checkpointing", "bfloat16 autocast", "activation
/// checkpointing and bfloat16 autocast", "no memory saver".
std::string describeSavers(MemorySavers savers);

}  // namespace batchpilot::core
