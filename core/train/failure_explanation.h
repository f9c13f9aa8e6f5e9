#pragma once

#include <cstdint>
#include <string>

#include "core/config/options.h"

/// What the trainer adds to LibTorch's message when a micro-batch fails for a reason other than
/// memory: a pure function of the message and the run's settings, so that every sentence a user
/// may read is tested on its own (tests/core/train/tst_trainer_errors.cpp).
namespace batchpilot::core {

/// A micro-batch that failed, and what the run allowed when it did.
struct MicroBatchFailure {
    std::string message;            ///< LibTorch's (or the model's) own words
    int64_t size = 0;               ///< samples in the micro-batch
    int64_t largestMicroBatch = 0;  ///< the most a micro-batch may hold here (target, limits)
    MemorySavers savers = MemorySavers::Off;
    bool checkpointingPossible = true;  ///< the model can be checkpointed (--memory-savers checkpoint)
};

/// BatchNorm's refusal of one value per channel in training (LibTorch's C++ and TorchScript
/// batch_norm both word it so).
bool needsTwoSamples(const std::string& message);

/// The message with what it means here and what to do: BatchNorm on a single sample where no
/// larger micro-batch is allowed, float16 or bfloat16 inputs a layer cannot take under the
/// memory savers' autocast. The message unchanged when none applies.
std::string explainMicroBatchFailure(const MicroBatchFailure& failure);

}  // namespace batchpilot::core
