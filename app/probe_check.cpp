// batchpilot-probe-check: runs BatchPilot's probe on a device and compares it with two true
// largest micro-batches, each found by bisection and confirmed by the sizes just above it:
//   - the plain loop's (yardstick/plain_loop.h: forward, backward into .grad, the optimizer's
//     step; no BatchPilot code): the yardstick the probe is measured against;
//   - BatchPilot's own (training runs at exactly n samples, by the plain loop's rule): where
//     training at the probe's size would run out of memory.
// Prints one table row, and exits 1 when the probe is above BatchPilot's own largest, below 97%
// of the plain loop's, or when BatchPilot's own largest is below 98% of the plain loop's (it
// would hold memory a plain loop does not). Used by scripts/gpu-check on real GPUs.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "app/cli_args.h"
#include "core/device/counting_allocator.h"
#include "core/device/cuda_meter.h"
#include "core/device/device.h"
#include "core/train/trainer.h"
#include "yardstick/plain_loop.h"

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
        if (std::holds_alternative<core::OomEvent>(e)) ++ooms;
    }
    core::Trainer* trainer = nullptr;  ///< stopped once its probe finished
    std::vector<core::ProbeTrial> trials;
    int ooms = 0;  ///< OOM events, the probe's trials included
    core::ProbeFinished finished;
    std::string error;
};

/// Whether BatchPilot trains with micro-batches of exactly n samples, by the plain loop's rule
/// (yardstick::plainLoopLargest): two training batches of two micro-batches each, without an OOM.
/// On a caching allocator a size that fits one micro-batch can fail the second, once the cache is
/// split up: that is what training at the probe's size meets.
bool fits(core::TrainerOptions o, int64_t n) {
    o.targetBatch = 2 * n;
    o.data.samples = std::max(o.data.samples, 2 * n);
    o.probe.initialMicroBatch = n;
    o.probe.maxMicroBatch = n;
    o.probe.objective = core::ProbeObjective::Largest;  // exactly n
    o.steps = 2;
    o.validation.split = 0;  // the plain loop does not validate
    Collect sink;
    core::Trainer trainer(o, sink);
    const core::RunResult result = trainer.run();
    return result.state == core::RunState::Finished && !sink.trials.empty() && sink.trials.front().fit &&
           sink.ooms == 0;
}

/// The share of the plain loop's largest micro-batch the probe must find.
constexpr double kGoal = 0.97;
/// The share of the plain loop's largest micro-batch BatchPilot must be able to train with.
constexpr double kParity = 0.98;

/// The plain loop on the same device, model, data, loss and optimizer.
yardstick::PlainLoopSetup plainSetup(const core::TrainerOptions& o) {
    yardstick::PlainLoopSetup setup;
    setup.model = o.model;
    setup.data = o.data;
    setup.loss = o.loss;
    setup.optimizer = o.optimizer;
    setup.device = o.device;
    return setup;
}

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

    const auto searchStarted = std::chrono::steady_clock::now();
    // BatchPilot's own largest: training runs at exactly n samples.
    int64_t own = 0;
    int64_t hi = options.targetBatch + 1;
    int checks = 0;
    while (hi - own > 1) {
        const int64_t mid = (own + hi) / 2;
        ++checks;
        (fits(options, mid) ? own : hi) = mid;
    }
    for (int64_t n = own + 1; n <= std::min(own + 3, options.targetBatch); ++n) {
        ++checks;
        if (fits(options, n)) own = n;
    }
    // The plain loop's largest, under the same cap where the GPU was capped to a fraction.
    const auto device = core::parseDevice(options.device);
    if (device && device->kind == core::DeviceKind::Cuda && options.cudaMemoryFraction > 0)
        core::setCudaMemoryFraction(device->index, options.cudaMemoryFraction);
    int64_t plain = 0;
    try {
        plain = yardstick::plainLoopLargest(plainSetup(options), options.targetBatch);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "batchpilot-probe-check: %s\n", e.what());
        return 1;
    }
    const double searchSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - searchStarted).count();
    int ooms = 0;
    for (const auto& t : probe.trials) ooms += t.fit ? 0 : 1;
    const int64_t found = probe.finished.microBatch;
    const auto share = [](int64_t part, int64_t whole) {
        return whole > 0 ? 100.0 * double(part) / double(whole) : 0.0;
    };
    std::printf(
        "| model | device | input | probe | plain loop's largest | probe/plain | BatchPilot's largest | "
        "BatchPilot/plain "
        "| trials | OOMs | probe s | searches s |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::printf("| %s | %s | %lldx%lldx%lld | %lld | %lld | %.1f%% | %lld | %.1f%% | %d | %d | %.2f | %.1f |\n",
                options.model.name.c_str(), options.device.c_str(), static_cast<long long>(options.data.channels),
                static_cast<long long>(options.data.height), static_cast<long long>(options.data.width),
                static_cast<long long>(found), static_cast<long long>(plain), share(found, plain),
                static_cast<long long>(own), share(own, plain), probe.finished.trials, ooms, probeSeconds,
                searchSeconds);
    if (plain <= 0 || own <= 0) {
        std::fprintf(stderr, "batchpilot-probe-check: not even one sample fits %s: nothing to compare\n",
                     options.device.c_str());
        return 1;
    }
    int status = 0;
    if (found > own) {
        std::fprintf(stderr,
                     "batchpilot-probe-check: FAIL: the probe chose %lld, above the %lld BatchPilot trains with: "
                     "training at its size would run out of memory\n",
                     static_cast<long long>(found), static_cast<long long>(own));
        status = 1;
    }
    // A size below its goal's share of the plain loop's largest.
    const auto belowGoal = [&](const char* what, int64_t size, double goal) {
        if (static_cast<double>(size) >= goal * static_cast<double>(plain)) return;
        std::fprintf(stderr,
                     "batchpilot-probe-check: FAIL: %s %lld, %.1f%% of the plain loop's largest %lld (goal: at "
                     "least %.0f%%)\n",
                     what, static_cast<long long>(size), share(size, plain), static_cast<long long>(plain),
                     100.0 * goal);
        status = 1;
    };
    belowGoal("the probe found", found, kGoal);
    belowGoal("BatchPilot trains with at most", own, kParity);
    return status;
}
