#pragma once

// The yardstick nobody tuned: a plain LibTorch training loop, written as a PyTorch user writes one
// (forward, loss × n_i/T, backward() into .grad, one optimizer step per training batch, the
// gradients set to None after it), on the same device and allocator as BatchPilot (a virtual GPU:
// the counting allocator with a budget; a CUDA device: the caching allocator, read by the same
// meter). No BatchPilot code is in its path: it borrows only the model (core::makeModel or a
// TorchScript file) and the samples (core::Dataset, read into host memory). The benchmarks and the
// probe-accuracy tests take their "true largest micro-batch" from it.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "core/config/options.h"

namespace batchpilot::yardstick {

/// What the plain loop trains, and where.
struct PlainLoopSetup {
    core::ModelOptions model;  ///< a built-in model or a TorchScript file, as BatchPilot takes it
    core::DataOptions data;    ///< the samples (synthetic by default)
    core::LossKind loss = core::LossKind::CrossEntropy;
    core::OptimizerOptions optimizer;  ///< kind, learning rate, momentum, weight decay
    int64_t budgetBytes = 0;           ///< the virtual GPU's budget (0: none), when `device` is empty
    /// Another device, as BatchPilot names it ("cuda:0": the caching allocator's reserved bytes,
    /// the GPU's own limit; "virtual:64MiB": the virtual GPU's caching model); empty:
    /// `virtual:<budgetBytes>/exact`, every byte counted, nothing cached or rounded.
    std::string device;

    std::string deviceName() const {
        return device.empty() ? "virtual:" + std::to_string(budgetBytes) + "/exact" : device;
    }
};

/// One run of the plain loop.
struct PlainLoopRun {
    bool fit = false;            ///< every step ran without an out-of-memory error
    int64_t peakBytes = 0;       ///< highest device memory of the run (reserved bytes: counted on a virtual GPU)
    int64_t parameterBytes = 0;  ///< the model on the device
    /// Parameters + gradients + optimizer state, measured between the last micro-batch's
    /// backward and the optimizer step of the last batch, less that micro-batch's leftovers: what
    /// stays on the device for the whole run.
    int64_t fixedBytes = 0;
    double seconds = 0;           ///< the steps after the first (0 with one step)
    double samplesPerSecond = 0;  ///< over those steps
    std::string error;            ///< a failure other than running out of memory
};

/// Trains `steps` training batches of `targetBatch` samples in micro-batches of `microBatch`
/// (the last one of a batch smaller when it does not divide), from a fresh model seeded with 1.
/// An out-of-memory error ends the run with fit false; any other error fills `error`.
PlainLoopRun runPlainLoop(const PlainLoopSetup& setup, int64_t microBatch, int64_t targetBatch, int steps);

/// The largest micro-batch the plain loop trains with on the budget: `microBatch` fits when two
/// training batches of two micro-batches each run (so the accumulated gradients and the optimizer
/// state exist while the last micro-batch runs). Bisection over [1, upper], then the
/// `confirmAbove` sizes just above are tried too (memory need not be monotone in the size).
/// A run without a budget comes first (see plain_loop.cpp). 0 when not even one sample fits.
int64_t plainLoopLargest(const PlainLoopSetup& setup, int64_t upper, int confirmAbove = 3);

/// One training batch, as the sample indices (into the data set) of each of its micro-batches.
using PlainBatch = std::vector<std::vector<int64_t>>;

/// Trains `batches` in order — each micro-batch's loss × n_i/T (T: the batch's samples), backward
/// into .grad, one optimizer step per batch — from a fresh model seeded with `seed`, and returns
/// the parameters it ends with (on the host). An independent reference for the weights of a
/// BatchPilot run: given the micro-batches a run committed (MicroBatchDone with sample indices),
/// it says what those micro-batches give when nothing went wrong. Throws on any error.
std::vector<torch::Tensor> replayPlainLoop(const PlainLoopSetup& setup, const std::vector<PlainBatch>& batches,
                                           uint64_t seed);

}  // namespace batchpilot::yardstick
