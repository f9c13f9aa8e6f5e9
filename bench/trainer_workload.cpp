#include "bench/trainer_workload.h"

#include <stdexcept>
#include <vector>

#include "core/train/trainer.h"

namespace batchpilot::bench {
namespace {

class StoringSink final : public core::EventSink {
public:
    void onEvent(const core::Event& event) override {
        events.push_back(event);
        if (hook) hook(event, *trainer);
    }
    std::vector<core::Event> events;
    EventHook hook;
    core::Trainer* trainer = nullptr;
};

}  // namespace

core::TrainerOptions cnnWorkload(const std::string& device, int64_t targetBatch, int64_t microBatch, int64_t steps) {
    core::TrainerOptions options;
    options.model.name = "cnn";
    options.model.width = 32;
    options.data.samples = 8192;
    options.data.height = 32;
    options.data.width = 32;
    options.device = device;
    options.targetBatch = targetBatch;
    options.steps = steps;
    options.seed = 1;
    options.optimizer.kind = core::OptimizerKind::Sgd;
    options.optimizer.learningRate = 0.05;
    options.optimizer.momentum = 0.9;
    if (microBatch > 0) {
        options.probe.initialMicroBatch = microBatch;
        options.probe.maxMicroBatch = microBatch;
        options.probe.objective = core::ProbeObjective::Largest;  // exactly this micro-batch
    }
    return options;
}

Throughput throughputOf(const std::vector<core::Event>& events, int64_t microBatch) {
    double firstEnd = -1, lastEnd = 0;
    int64_t firstSeen = 0, samples = 0;
    Throughput out;
    for (const core::Event& event : events) {
        const auto* metrics = std::get_if<core::StepMetrics>(&event);
        if (!metrics) continue;
        if (metrics->step == 1) {
            firstEnd = metrics->time;
            firstSeen = metrics->samplesSeen;
            continue;
        }
        samples = metrics->samplesSeen - firstSeen;
        lastEnd = metrics->time;
        out.accumulationSteps = metrics->accumulationSteps;
    }
    if (firstEnd < 0 || samples == 0) throw std::runtime_error("benchmark run made fewer than two steps");
    out.samplesPerSecond = static_cast<double>(samples) / (lastEnd - firstEnd);
    out.microBatch = microBatch;
    out.events = static_cast<int64_t>(events.size());
    return out;
}

RecordedRun runEvents(const core::TrainerOptions& options, const EventHook& hook) {
    StoringSink sink;
    sink.hook = hook;
    core::Trainer trainer(options, sink);
    sink.trainer = &trainer;
    RecordedRun run{trainer.run(), {}};
    if (run.result.state == core::RunState::Failed)
        throw std::runtime_error("benchmark run failed: " + run.result.error);
    run.events = std::move(sink.events);
    return run;
}

Throughput runTrainer(const core::TrainerOptions& options) {
    const RecordedRun run = runEvents(options);
    return throughputOf(run.events, run.result.microBatch);
}

}  // namespace batchpilot::bench
