#pragma once

// Memory savers (issue 15): what training may trade for device memory, as the option
// memory_savers (core/config/options.h) names it. The trainer applies them (trainer_memory.cpp):
// activation checkpointing through the model (Model::setCheckpointing, built on
// core/nn/activation_checkpoint.h), bfloat16 or float16 autocast around the forward pass, and for
// float16 dynamic loss scaling of the backward pass.

#include <string>

#include "core/config/options.h"

namespace batchpilot::core {

/// True when `savers` recompute activations in backward (checkpoint, both).
bool checkpoints(MemorySavers savers);
/// True when `savers` run the forward pass under bfloat16 autocast (bf16, both).
bool autocastsBf16(MemorySavers savers);
/// True when `savers` run the forward pass under float16 autocast and scale the loss (fp16,
/// checkpoint-fp16).
bool autocastsFp16(MemorySavers savers);

/// float16 loss scaling: steps without an overflow before the scale doubles (GradScaler's 2000),
/// and the scale below which an overflow ends the run (the gradients are not finite even unscaled).
inline constexpr int64_t kLossScaleGrowthSteps = 2000;
inline constexpr double kMinLossScale = 1.0;
/// In words for messages: "activation checkpointing", "bfloat16 autocast", "activation
/// checkpointing and bfloat16 autocast", "float16 autocast with loss scaling", …, "no memory saver".
std::string describeSavers(MemorySavers savers);

}  // namespace batchpilot::core
