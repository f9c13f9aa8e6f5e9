#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace batchpilot::core {

/// The trainer's micro-batch sizes between probes, and what an out-of-memory error or a run of
/// clean steps makes of them. Torch-free and without a device: the decisions a wrong change would
/// lose a sample by are tested on their own (tests/core/plan/tst_micro_batch_sizes.cpp), beside
/// ProbeSearch, which finds the sizes.
///
/// Thread rules: the trainer's thread only.
struct MicroBatchSizes {
    /// OOMs in a row at micro-batch 1 retried before the model is declared too big for the device
    /// (memory can be taken by others for a moment).
    static constexpr int kSingleSampleRetries = 2;

    int64_t microBatch = 0;  ///< in use; 0 until the first probe finishes
    int64_t probed = 0;      ///< the last probe's result: where a regrow probes up to
    /// Smallest micro-batch the model can train on: 2 once BatchNorm refused a single sample
    /// (a 1x1 feature map leaves it one value per channel).
    int64_t minMicroBatch = 1;
    /// Smallest part the rest of a batch is split into, never below minMicroBatch: 2 for
    /// BatchNorm models from the start (one sample normalised alone is useless even where
    /// BatchNorm accepts it).
    int64_t minPart = 1;
    /// The size the last fastest-size search chose, where the next one starts (0: none yet, or
    /// the run moved to other hardware or savers, where the old timings say nothing).
    int64_t lastChosen = 0;
    int cleanStepsSinceShrink = -1;  ///< -1: no shrink pending a regrow
    int singleSampleOoms = 0;        ///< consecutive OOMs at micro-batch 1

    /// The rest of a batch, `remaining` samples, split for training at `micro`
    /// (AccumulationPlan::split), with a last part below minPart merged into the one before it
    /// (only possible at micro-batch 2: 2+1 -> 3).
    std::vector<int64_t> planFor(int64_t remaining, int64_t micro) const;

    /// A probe found `size`: it is used from now on.
    void probeFound(int64_t size) { microBatch = probed = size; }
    /// BatchNorm refused one sample: micro-batches and parts hold at least 2 from now on (the
    /// size in use is the caller's to raise, outside a probe).
    void requireTwoSamples();

    /// A micro-batch of one sample ran out of memory: true while it is retried as it is (and
    /// counts the retry); false once kSingleSampleRetries were spent.
    bool retrySingleSample(int64_t size);
    /// A micro-batch succeeded: single-sample retries start again from 0.
    void succeeded() { singleSampleOoms = 0; }

    /// Composer's thrashing rule: a caching allocator that had to flush its cache and retry in
    /// kThrashingSteps consecutive optimizer steps at a settled size (no probe, no timing) is
    /// fragmented at that size. Called once per step with the retries made during it; true when
    /// the micro-batch should shrink now (the count starts again).
    static constexpr int kThrashingSteps = 2;
    bool thrashing(int64_t retriesInStep, bool settled);
    int thrashingSteps = 0;  ///< consecutive settled steps with retries
    /// A training micro-batch of `size` ran out of memory: the size training goes on at (half of
    /// it, never below minMicroBatch; a regrow is then pending), or nullopt when none smaller is
    /// left (the memory savers, or the end of the run).
    std::optional<int64_t> shrinkAfterOom(int64_t size);
    /// An optimizer step without an OOM shrink (not while probing): true when, `regrowAfter`
    /// steps after the last shrink, a probe should look for a larger size again (up to `probed`).
    bool cleanStep(int regrowAfter);
};

}  // namespace batchpilot::core
