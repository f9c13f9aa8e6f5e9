#pragma once

#include <string>

#include <torch/torch.h>

#include "core/config/options.h"

namespace batchpilot::core {

/// The mean training loss of one micro-batch, as a scalar with autograd history.
///
/// CrossEntropy: `output` [N, classes] logits, `target` int64 [N] class ids (or float [N, classes]
/// class probabilities). Mse: `target` float of the output's shape (a [N, 1] target also serves an
/// [N] output); int64 class ids [N] against [N, classes] outputs are one-hot encoded first.
/// A mismatch (e.g. float regression targets with cross-entropy) throws std::invalid_argument
/// whose message names both shapes and the loss to use; the trainer reports it as an error.
/// A floating output of another type (bfloat16 from the memory saver bf16's autocast) is taken
/// in float32, so the loss and its gradient start at full precision.
///
/// Thread rules: none of its own; call on the thread that owns the tensors.
torch::Tensor computeLoss(LossKind kind, const torch::Tensor& output, const torch::Tensor& target);

/// A tensor's shape for messages: "[32, 10]".
std::string shapeText(const torch::Tensor& tensor);

}  // namespace batchpilot::core
