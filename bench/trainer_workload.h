#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/events.h"
#include "core/options.h"

/// The training workload the accumulation and meter benchmarks time, and how they time it.
namespace batchpilot::bench {

/// The small CNN on 3×32×32 synthetic images, SGD with momentum, seed 1, on `device`, with the
/// micro-batch fixed to `microBatch` (the probe's single trial at that size is the first
/// micro-batch) or, with 0, chosen by the probe.
core::TrainerOptions cnnWorkload(const std::string& device, int64_t targetBatch, int64_t microBatch, int64_t steps);

/// Throughput of a finished-probe, steady-state run.
struct Throughput {
    double samplesPerSecond = 0;  ///< over steps 2..N (step 1 holds the probe)
    int64_t microBatch = 0;       ///< micro-batch in use at the end
    int64_t accumulationSteps = 0;
    int64_t events = 0;  ///< events the sink stored
};

/// Throughput over steps 2..N of the events of one run (its StepMetrics events; `microBatch` is
/// the run's final one). Throws when the run made fewer than two steps.
Throughput throughputOf(const std::vector<core::Event>& events, int64_t microBatch);

/// Runs a Trainer with `options` (steps ≥ 2); events go to a sink that stores every one of
/// them, as the CLI's JSON Lines writer or the GUI's queue would. Throws on a failed run.
Throughput runTrainer(const core::TrainerOptions& options);

}  // namespace batchpilot::bench
