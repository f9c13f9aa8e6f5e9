#include "bench/trial_runner.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "core/train/trainer.h"

namespace batchpilot::bench {
namespace {

/// Keeps the first probe trial and stops the run right after it.
class FirstTrialSink final : public core::EventSink {
public:
    void onEvent(const core::Event& event) override {
        if (const auto* trial = std::get_if<core::ProbeTrial>(&event); trial && !first) {
            first = *trial;
            if (trainer) trainer->stop();
        }
    }
    std::optional<core::ProbeTrial> first;
    core::Trainer* trainer = nullptr;
};

}  // namespace

namespace {

constexpr int64_t kMiB = 1024 * 1024;

ProbeSetup setup(const std::string& model, int64_t width, int64_t side, int64_t budgetMiB, int64_t upperBound) {
    ProbeSetup s;
    s.label = model + " 3x" + std::to_string(side) + "x" + std::to_string(side);
    s.model.name = model;
    s.model.width = width;
    s.data.channels = 3;
    s.data.height = side;
    s.data.width = side;
    s.budgetBytes = budgetMiB * kMiB;
    s.upperBound = upperBound;
    return s;
}

}  // namespace

std::vector<ProbeSetup> probeSetups(bool quick) {
    std::vector<ProbeSetup> all = {
        setup("mlp", 16, 32, 7, 2048),      setup("mlp", 16, 32, 10, 2048),     setup("mlp", 16, 32, 14, 2048),
        setup("cnn", 32, 32, 24, 2048),     setup("cnn", 32, 32, 56, 2048),     setup("cnn", 32, 32, 120, 2048),
        setup("resnet", 16, 64, 48, 512),   setup("resnet", 16, 64, 96, 512),   setup("resnet", 16, 64, 200, 512),
        setup("resnet", 16, 224, 160, 256), setup("resnet", 16, 224, 320, 256), setup("resnet", 16, 224, 640, 256),
    };
    if (quick) all = {all[0], all[3], all[6], all[9]};
    return all;
}

std::string ProbeSetup::device() const {
    return "virtual:" + std::to_string(budgetBytes) + "/exact";
}

core::TrainerOptions ProbeSetup::trainerOptions() const {
    core::TrainerOptions options;
    options.model = model;
    options.data = data;
    options.device = device();
    options.steps = 1;
    options.seed = 1;
    options.optimizer.kind = core::OptimizerKind::Sgd;
    options.optimizer.momentum = 0.9;
    return options;
}

yardstick::PlainLoopSetup plainLoopSetup(const ProbeSetup& setup) {
    const core::TrainerOptions options = setup.trainerOptions();
    yardstick::PlainLoopSetup loop;
    loop.model = options.model;
    loop.data = options.data;
    loop.optimizer = options.optimizer;
    loop.budgetBytes = setup.budgetBytes;
    return loop;
}

const Trial& TrialRunner::run(int64_t size) {
    if (auto it = m_cache.find(size); it != m_cache.end()) return it->second;
    core::TrainerOptions options = m_setup.trainerOptions();
    options.targetBatch = size;
    options.data.samples = size;
    options.probe.initialMicroBatch = size;
    options.probe.maxMicroBatch = size;
    options.probe.objective = core::ProbeObjective::Largest;  // one trial of exactly this size
    options.probe.headroom = 0;
    const auto started = std::chrono::steady_clock::now();
    FirstTrialSink sink;
    core::Trainer trainer(options, sink);
    sink.trainer = &trainer;
    trainer.run();
    m_measuredSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    // No trial event: the model, its gradients and optimizer state alone exceed the budget.
    Trial trial{size, false, 0, 0};
    if (sink.first) trial = {size, sink.first->fit, sink.first->peakBytes, sink.first->seconds};
    return m_cache.emplace(size, trial).first->second;
}

TrueMaximum findTrueMaximum(TrialRunner& runner, int confirmAbove) {
    const int64_t bound = runner.setup().upperBound;
    TrueMaximum truth;
    int64_t lo = 0;
    int64_t hi = bound + 1;
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        ++truth.checks;
        (runner.run(mid).fit ? lo : hi) = mid;
    }
    for (int64_t n = lo + 1; n <= std::min(lo + confirmAbove, bound); ++n) {
        ++truth.checks;
        if (runner.run(n).fit) lo = n;
    }
    truth.size = lo;
    return truth;
}

}  // namespace batchpilot::bench
