#include "bench/probe_strategies.h"

#include <algorithm>
#include <cmath>

#include "core/plan/probe_search.h"

namespace batchpilot::bench {
namespace {

/// Runs trials for a baseline: none of its trials is kept for training.
class BaselineRun {
public:
    BaselineRun(std::string name, const TrialFunction& trial) : m_trial(trial) { m_result.name = std::move(name); }
    bool fits(int64_t size) {
        const TrialOutcome outcome = m_trial(size);
        m_result.trials.push_back({outcome, /*committed=*/false, /*replayed=*/false});
        return outcome.fit;
    }
    const TrialOutcome& last() const { return m_result.trials.back().outcome; }
    StrategyResult finish(int64_t found) {
        m_result.found = found;
        return std::move(m_result);
    }

private:
    const TrialFunction& m_trial;
    StrategyResult m_result;
};

}  // namespace

int StrategyResult::ooms() const {
    return static_cast<int>(
        std::count_if(trials.begin(), trials.end(), [](const StrategyTrial& t) { return !t.outcome.fit; }));
}

double StrategyResult::seconds() const {
    double total = 0;
    for (const StrategyTrial& t : trials) total += t.outcome.seconds;
    return total;
}

int64_t StrategyResult::samplesDiscarded() const {
    int64_t discarded = 0;
    for (const StrategyTrial& t : trials) {
        if (!t.committed && !t.replayed) discarded += t.outcome.size;
    }
    return discarded;
}

StrategyResult batchPilotProbe(const std::string& name, const core::ProbeOptions& options, const ProbeLimits& limits,
                               const TrialFunction& trial) {
    const auto usable = static_cast<int64_t>(static_cast<double>(limits.capacityBytes) * (1.0 - options.headroom));
    core::ProbeSearch search(options, limits.upperBound, usable);
    StrategyResult result;
    result.name = name;
    while (const auto size = search.next()) {
        const TrialOutcome outcome = trial(*size);
        search.record({outcome.size, outcome.fit, outcome.peakBytes});
        // As in Trainer::trainBatch: a trial that ran forward and backward adds its gradients to
        // the batch (also when its peak crossed the headroom line); after an OOM the same samples
        // start the next micro-batch.
        result.trials.push_back({outcome, /*committed=*/outcome.fit, /*replayed=*/!outcome.fit});
    }
    result.found = search.result();
    return result;
}

StrategyResult baselineDoubleHalveOnce(const ProbeLimits& limits, const TrialFunction& trial) {
    BaselineRun run("double, halve once", trial);
    int64_t size = 1;
    while (run.fits(size)) {
        if (size >= limits.upperBound) return run.finish(size);
        size = std::min(2 * size, limits.upperBound);
    }
    // The recipe trains at half the size that failed, without trying it again.
    return run.finish(size / 2);
}

StrategyResult baselinePowerOfTwo(const ProbeLimits& limits, const TrialFunction& trial) {
    BaselineRun run("powers of two", trial);
    int64_t best = 0;
    for (int64_t size = 1; size <= limits.upperBound; size *= 2) {
        if (!run.fits(size)) break;
        best = size;
    }
    return run.finish(best);
}

StrategyResult baselineShrinkFrom128(double factor, const ProbeLimits& limits, const TrialFunction& trial) {
    BaselineRun run(factor == 0.5 ? "halve from 128" : "x0.9 from 128", trial);
    int64_t size = std::min<int64_t>(128, limits.upperBound);
    while (size >= 1) {
        if (run.fits(size)) return run.finish(size);
        // At least one smaller, so ×0.9 cannot stall at small sizes.
        size = std::min(size - 1, static_cast<int64_t>(std::floor(static_cast<double>(size) * factor)));
    }
    return run.finish(0);
}

StrategyResult baselineDoubleThenBisect(const ProbeLimits& limits, const TrialFunction& trial) {
    BaselineRun run("double, then bisect", trial);
    int64_t lo = 0;
    int64_t hi = 0;  // smallest failure, 0 while none
    for (int64_t size = 1;; size = std::min(2 * size, limits.upperBound)) {
        if (!run.fits(size)) {
            hi = size;
            break;
        }
        lo = size;
        if (size >= limits.upperBound) return run.finish(lo);
    }
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (run.fits(mid) ? lo : hi) = mid;
    }
    return run.finish(lo);
}

StrategyResult baselineLinearFit60(const ProbeLimits& limits, const TrialFunction& trial) {
    BaselineRun run("linear fit to 60%", trial);
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    int64_t largestFit = 0;
    for (int64_t size : {1, 2, 4, 8, 16}) {
        if (size > limits.upperBound || !run.fits(size)) break;
        const auto x = static_cast<double>(size);
        const auto y = static_cast<double>(run.last().peakBytes);
        n += 1;
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
        largestFit = size;
    }
    const double denominator = n * sxx - sx * sx;
    if (n < 2 || denominator <= 0) return run.finish(largestFit);
    const double slope = (n * sxy - sx * sy) / denominator;
    const double intercept = (sy - slope * sx) / n;
    if (slope <= 0) return run.finish(largestFit);
    const double predicted = (0.6 * static_cast<double>(limits.capacityBytes) - intercept) / slope;
    return run.finish(std::clamp<int64_t>(static_cast<int64_t>(std::floor(predicted)), 0, limits.upperBound));
}

std::vector<StrategyResult> runAllStrategies(const ProbeLimits& limits, const TrialFunction& trial) {
    core::ProbeOptions defaults;
    core::ProbeOptions noHeadroom;
    noHeadroom.headroom = 0;
    std::vector<StrategyResult> results;
    results.push_back(batchPilotProbe("BatchPilot (default)", defaults, limits, trial));
    results.push_back(batchPilotProbe("BatchPilot (headroom 0)", noHeadroom, limits, trial));
    results.push_back(baselineDoubleHalveOnce(limits, trial));
    results.push_back(baselinePowerOfTwo(limits, trial));
    results.push_back(baselineShrinkFrom128(0.5, limits, trial));
    results.push_back(baselineShrinkFrom128(0.9, limits, trial));
    results.push_back(baselineDoubleThenBisect(limits, trial));
    results.push_back(baselineLinearFit60(limits, trial));
    return results;
}

}  // namespace batchpilot::bench
