#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config/options.h"

/// The strategies the probe benchmark compares, run against the same trial function. All but
/// BatchPilot's are baselines: the known recipes for "find the largest batch that fits", written
/// here for the comparison only. Torch-free: a trial is whatever the function measures.
namespace batchpilot::bench {

/// Outcome of one trial as a strategy sees it.
struct TrialOutcome {
    int64_t size = 0;
    bool fit = false;
    int64_t peakBytes = 0;
    double seconds = 0;
};

using TrialFunction = std::function<TrialOutcome(int64_t size)>;

/// What the strategy may use: the largest size it may choose and the device's capacity.
struct ProbeLimits {
    int64_t upperBound = 1;
    int64_t capacityBytes = 0;
};

/// One trial as a strategy ran it, and what became of its samples.
struct StrategyTrial {
    TrialOutcome outcome;
    /// The trial's gradients were added to a training batch (BatchPilot keeps a fitting trial).
    bool committed = false;
    /// An OOM trial whose samples are trained later (BatchPilot replays them in the next
    /// micro-batch); baselines throw every trial's batch away.
    bool replayed = false;
};

struct StrategyResult {
    std::string name;
    int64_t found = 0;  ///< the micro-batch the strategy would train with (0: none)
    std::vector<StrategyTrial> trials;

    int ooms() const;
    double seconds() const;  ///< sum of the trials' durations
    /// Samples of trials that were neither committed to training nor replayed.
    int64_t samplesDiscarded() const;
};

/// BatchPilot's probe (core::ProbeSearch) with `options`, as the trainer drives it: a fitting
/// trial is part of the training batch, an OOM trial's samples start the next micro-batch.
StrategyResult batchPilotProbe(const std::string& name, const core::ProbeOptions& options, const ProbeLimits& limits,
                               const TrialFunction& trial);

/// Baseline: double from 1 until the first failure, then halve the failed size once.
StrategyResult baselineDoubleHalveOnce(const ProbeLimits& limits, const TrialFunction& trial);
/// Baseline: powers of two only; the answer is the last power of two that fit.
StrategyResult baselinePowerOfTwo(const ProbeLimits& limits, const TrialFunction& trial);
/// Baseline: start at 128 and multiply by `factor` (0.5 or 0.9) until a size fits.
StrategyResult baselineShrinkFrom128(double factor, const ProbeLimits& limits, const TrialFunction& trial);
/// Baseline: double until the first failure, then binary search between the last fit and the
/// failure until they are adjacent. No memory model.
StrategyResult baselineDoubleThenBisect(const ProbeLimits& limits, const TrialFunction& trial);
/// Baseline: measure the peaks of 1, 2, 4, 8, 16 samples, fit peak = a + b·n by least squares
/// and take the largest n predicted to use at most 60% of the capacity. No check of the answer.
StrategyResult baselineLinearFit60(const ProbeLimits& limits, const TrialFunction& trial);

/// Every strategy of the benchmark, in table order.
std::vector<StrategyResult> runAllStrategies(const ProbeLimits& limits, const TrialFunction& trial);

}  // namespace batchpilot::bench
