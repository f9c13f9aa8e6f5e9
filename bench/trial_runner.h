#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/config/options.h"
#include "yardstick/plain_loop.h"

/// Real probe trials for the benchmarks, and the true largest micro-batch found with them.
namespace batchpilot::bench {

/// A model, its data and a virtual GPU budget: one row group of the probe benchmark.
struct ProbeSetup {
    std::string label;  ///< e.g. "resnet 3x224x224"
    core::ModelOptions model;
    core::DataOptions data;   ///< samples is set per run
    int64_t budgetBytes = 0;  ///< the virtual GPU
    int64_t upperBound = 0;   ///< largest micro-batch any strategy may choose (the target batch)

    /// "virtual:<bytes>".
    std::string device() const;
    /// Trainer options for this setup (SGD with momentum, seed 1, one step); the caller sets the
    /// target batch and the probe options.
    core::TrainerOptions trainerOptions() const;
};

/// The 12 probe setups the benchmarks share: mlp and cnn at 3×32×32, the ResNet at 3×64×64 and
/// 3×224×224, each on three virtual GPU budgets chosen so the true maxima are not powers of two
/// and the ResNet at 224×224 stays at tens of samples. Quick: one of each model and size (4).
std::vector<ProbeSetup> probeSetups(bool quick);

/// The setup for the plain training loop (yardstick/plain_loop.h): the same model, data, budget
/// and optimizer (SGD with momentum) as trainerOptions().
yardstick::PlainLoopSetup plainLoopSetup(const ProbeSetup& setup);

/// One measured trial: a forward and backward pass of `size` samples on the virtual GPU with
/// the model's parameters, the gradient accumulators and the optimizer state (held back as the
/// trainer's first probe does) present.
struct Trial {
    int64_t size = 0;
    bool fit = false;
    int64_t peakBytes = 0;  ///< peak device memory during the trial (fits), as the trainer meters it
    double seconds = 0;     ///< duration of the forward and backward pass (or up to the OOM)
};

/// Runs trials exactly as the trainer does — each one is a core::Trainer run whose target batch,
/// initial and maximum micro-batch all equal the size, so its first probe trial is that size —
/// and caches the outcome per size, so the exhaustive search and every strategy share them.
class TrialRunner {
public:
    explicit TrialRunner(ProbeSetup setup) : m_setup(std::move(setup)) {}

    /// The trial at `size` (measured on first use, then cached).
    const Trial& run(int64_t size);
    /// Trials measured so far (cache misses) and the seconds their runs took in all.
    int measured() const { return static_cast<int>(m_cache.size()); }
    double measuredSeconds() const { return m_measuredSeconds; }
    const std::map<int64_t, Trial>& cache() const { return m_cache; }
    const ProbeSetup& setup() const { return m_setup; }

private:
    ProbeSetup m_setup;
    std::map<int64_t, Trial> m_cache;
    double m_measuredSeconds = 0;
};

/// The true largest micro-batch: bisection over [1, upperBound] with real trials, then the
/// `confirmAbove` sizes just above the result are tried too (memory need not be monotone in the
/// size), and any larger size that fit moves the result up.
struct TrueMaximum {
    int64_t size = 0;  ///< 0 when not even one sample fits
    int checks = 0;    ///< sizes the search looked at
};
TrueMaximum findTrueMaximum(TrialRunner& runner, int confirmAbove = 3);

}  // namespace batchpilot::bench
