// batchpilot-probe-check: runs BatchPilot's probe on a device and compares it with the true
// largest micro-batch, found by bisection over real single trials and confirmed by checking the
// sizes just above it. Prints one table row per model, and exits 1 when the probe is above the
// true largest or below 97% of it. Used by scripts/gpu-check on real GPUs.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "app/cli_args.h"
#include "core/device/counting_allocator.h"
#include "core/train/trainer.h"

namespace {

using namespace batchpilot;

class Collect final : public core::EventSink {
public:
    void onEvent(const core::Event& e) override {
        if (const auto* t = std::get_if<core::ProbeTrial>(&e)) trials.push_back(*t);
        if (const auto* f = std::get_if<core::ProbeFinished>(&e)) {
            finished = *f;
            if (trainer != nullptr) trainer->stop();  // the probe is what is measured
        }
        if (const auto* err = std::get_if<core::ErrorEvent>(&e)) error = err->message;
    }
    core::Trainer* trainer = nullptr;  ///< stopped once its probe finished
    std::vector<core::ProbeTrial> trials;
    core::ProbeFinished finished;
    std::string error;
};

bool fits(core::TrainerOptions o, int64_t n) {
    o.targetBatch = n;
    o.probe.initialMicroBatch = n;
    o.probe.maxMicroBatch = n;
    o.probe.objective = core::ProbeObjective::Largest;  // exactly n
    o.steps = 1;
    Collect sink;
    core::Trainer trainer(o, sink);
    trainer.run();
    return !sink.trials.empty() && sink.trials.front().fit;
}

/// The share of the true largest micro-batch the probe must find.
constexpr double kGoal = 0.97;

}  // namespace

int main(int argc, char** argv) {
    core::installCountingAllocator();
    auto request = app::parseCli(std::vector<std::string>(argv + 1, argv + argc));
    if (!request || request->help) {
        std::fprintf(stderr,
                     "usage: batchpilot-probe-check [batchpilot-cli flags]  (e.g. --model resnet --image-size "
                     "3x224x224 --device cuda:0 --target-batch 4096)\n%s\n",
                     request ? "" : request.error().c_str());
        return request ? 0 : 2;
    }
    core::TrainerOptions options = request->options;
    // The probe's trials train the first batches' samples: a probe up to a large target batch
    // can take several batches (with one step it ended unfinished, and reported 0).
    options.steps = 1000;
    options.probe.headroom = 0;
    options.data.samples = std::max(options.data.samples, options.targetBatch);

    Collect probe;
    {
        // Its own scope: the probe run's model and optimizer state must be gone before the
        // true-maximum search, or they would keep counting against the device.
        core::Trainer trainer(options, probe);
        probe.trainer = &trainer;
        const auto result = trainer.run();
        if (result.state == core::RunState::Failed) {
            std::fprintf(stderr, "batchpilot-probe-check: %s\n", result.error.c_str());
            return 1;
        }
    }
    if (probe.finished.sequence == 0) {
        std::fprintf(stderr, "batchpilot-probe-check: the probe did not finish in %lld steps\n",
                     static_cast<long long>(*options.steps));
        return 1;
    }
    const double probeSeconds = probe.finished.seconds;

    const auto truthStarted = std::chrono::steady_clock::now();
    int64_t lo = 0;
    int64_t hi = options.targetBatch + 1;
    int checks = 0;
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        ++checks;
        (fits(options, mid) ? lo : hi) = mid;
    }
    for (int64_t n = lo + 1; n <= std::min(lo + 3, options.targetBatch); ++n) {
        ++checks;
        if (fits(options, n)) lo = n;
    }
    const double truthSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - truthStarted).count();
    int ooms = 0;
    for (const auto& t : probe.trials) ooms += t.fit ? 0 : 1;
    std::printf(
        "| model | device | input | probe | true max | found/true | trials | OOMs | probe s | search s (%d runs) |\n",
        checks);
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
    std::printf("| %s | %s | %lldx%lldx%lld | %lld | %lld | %.1f%% | %d | %d | %.2f | %.1f |\n",
                options.model.name.c_str(), options.device.c_str(), static_cast<long long>(options.data.channels),
                static_cast<long long>(options.data.height), static_cast<long long>(options.data.width),
                static_cast<long long>(probe.finished.microBatch), static_cast<long long>(lo),
                lo > 0 ? 100.0 * double(probe.finished.microBatch) / double(lo) : 0.0, probe.finished.trials, ooms,
                probeSeconds, truthSeconds);
    // What scripts/gpu-check relies on: the probe within 97% of the true largest, and never above
    // it (a size that fit the probe's trial but not a training run of that size).
    const int64_t found = probe.finished.microBatch;
    if (lo <= 0) {
        std::fprintf(stderr, "batchpilot-probe-check: not even one sample fits %s: nothing to compare\n",
                     options.device.c_str());
        return 1;
    }
    if (found > lo) {
        std::fprintf(stderr,
                     "batchpilot-probe-check: FAIL: the probe chose %lld, above the true largest %lld: training at "
                     "its size would run out of memory\n",
                     static_cast<long long>(found), static_cast<long long>(lo));
        return 1;
    }
    if (static_cast<double>(found) < kGoal * static_cast<double>(lo)) {
        std::fprintf(stderr,
                     "batchpilot-probe-check: FAIL: the probe found %lld, %.1f%% of the true largest %lld (goal: "
                     "at least %.0f%%)\n",
                     static_cast<long long>(found), 100.0 * double(found) / double(lo), static_cast<long long>(lo),
                     100.0 * kGoal);
        return 1;
    }
    return 0;
}
