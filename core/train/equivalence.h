#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/events/events.h"
#include "core/config/options.h"

namespace batchpilot::core {

class Model;

/// The check behind "accumulation is exact": the gradient of one batch computed as the trainer
/// computes it — micro-batches of the given sizes, each mean loss weighted by n_i / T, gradients
/// summed — and the same batch's gradient from one full pass.
///
/// Thread rules: call on the thread that owns the model's tensors (the trainer's).

/// Accumulated gradient of `inputs`/`targets` split into `microBatchSizes` (which must sum to the
/// batch). The model's buffers (BatchNorm statistics) are restored afterwards; parameters and
/// their .grad are untouched.
std::vector<torch::Tensor> accumulatedGradient(Model& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                                               const std::vector<int64_t>& microBatchSizes, LossKind loss);

/// Gradient of the whole batch in one forward and backward pass; buffers restored afterwards.
/// `lossScale`: backward runs on the loss times it and the gradients are divided by it again
/// (float16 autocast, as training does it).
std::vector<torch::Tensor> fullBatchGradient(Model& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                                             LossKind loss, double lossScale = 1.0);

/// Compares two gradients tensor by tensor (and all together): max absolute difference,
/// ‖accumulated − full‖ / ‖full‖ and cosine similarity, computed in double precision. Fills
/// `tensors` and `overall` of the result; the rest is left to the caller.
void compareGradients(const std::vector<std::string>& names, const std::vector<torch::Tensor>& accumulated,
                      const std::vector<torch::Tensor>& full, EquivalenceChecked& result);

/// Plain-language reading of a finished check (sets nothing; returns the text).
std::string explainEquivalence(const EquivalenceChecked& result);

}  // namespace batchpilot::core
