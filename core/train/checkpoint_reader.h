#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tl/expected.hpp>
#include <torch/torch.h>

#include "core/train/checkpoint.h"

namespace batchpilot::core {

/// The checkpoint file's format version, written first in its archive.
inline constexpr int64_t kCheckpointFormat = 1;

/// What a checkpoint's archive holds, read and checked, not yet applied to a model or optimizer.
struct CheckpointContents {
    TrainerState state;
    int64_t optimizerSteps = 0;
    /// On the CPU; each of the model's (or, for the optimizer's two slots, of its parameters')
    /// dtype and shape.
    std::vector<torch::Tensor> parameters, buffers, first, second;
};

/// Reads every field of a checkpoint's archive and checks it: its type, then the range a run
/// writes (checkTrainerState()), then the tensors against `model` and `optimizer` (which are
/// not changed): counts, dtypes, shapes, finite values, and the optimizer's own rules
/// (Optimizer::checkState()). A count of tensors is checked before anything is allocated for
/// it, so memory stays bounded by what the file holds. The error names `path`, the field (the
/// archive's key: "target_batch", "parameter3", "secondcount"), its value, what was expected and
/// what to do. Thread rules: any thread; the tensors stay on the CPU.
tl::expected<CheckpointContents, std::string> readCheckpoint(torch::serialize::InputArchive& archive,
                                                             const std::string& path, const Model& model,
                                                             const Optimizer& optimizer);

/// Each field of a trainer state within what a run writes, in the configuration file's words
/// where the field is an option's ("target_batch: expected an integer from 1 to 2147483648, got
/// 0"): step, sample count, sampler epoch at least 0; the sampler's position within the training
/// samples recorded; target batch, learning rate and loss scale within their options' ranges;
/// the micro-batch from 0 (not probed yet) to the largest target batch; the best value finite or
/// none. The
/// message names the field and its value.
tl::expected<void, std::string> checkTrainerState(const TrainerState& state);

}  // namespace batchpilot::core
