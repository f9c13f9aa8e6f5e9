#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/events/events.h"
#include "core/config/options.h"
#include "core/train/trainer.h"

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

/// Sees each event on the trainer's thread, with the trainer, to stop or steer the run.
using EventHook = std::function<void(const core::Event&, core::Trainer&)>;

/// A finished run and every event it sent, stored as the CLI's JSON Lines writer or the GUI's
/// queue would.
struct RecordedRun {
    core::RunResult result;
    std::vector<core::Event> events;
};

/// Runs a Trainer with `options`; `hook` (optional) sees each event as it is stored. Throws on a
/// failed run.
RecordedRun runEvents(const core::TrainerOptions& options, const EventHook& hook = {});

/// Runs a Trainer with `options` (steps ≥ 2) and measures its throughput (runEvents, then
/// throughputOf). Throws on a failed run.
Throughput runTrainer(const core::TrainerOptions& options);

}  // namespace batchpilot::bench
