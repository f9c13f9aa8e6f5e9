// batchpilot-bench-insight: what the memory insight and teaching mode cost and how far they can
// be trusted. (1) Training with the teaching instrumentation on (running gradient norm and sample
// indices per micro-batch, as the GUI runs) against off, interleaved. (2) An equivalence check's
// time in training steps of the same batch. (3) The what-if prediction: the probe's fitted memory
// model against the peak measured at a quarter, half, one and two times the chosen micro-batch,
// and how much of each measured peak the breakdown's parts explain. Writes insight.json and
// insight.csv.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <torch/version.h>

#include "bench/bench_util.h"
#include "bench/trainer_workload.h"
#include "core/device/counting_allocator.h"
#include "core/train/trainer.h"
#include "bench/bench_main.h"

namespace bench_insight {

namespace {

using namespace batchpilot;
using Clock = std::chrono::steady_clock;

class StoringSink final : public core::EventSink {
public:
    void onEvent(const core::Event& event) override { events.push_back(event); }
    template <typename T>
    std::vector<T> all() const {
        std::vector<T> out;
        for (const auto& e : events) {
            if (const auto* typed = std::get_if<T>(&e)) out.push_back(*typed);
        }
        return out;
    }
    std::vector<core::Event> events;
};

/// Runs to the end; `onEvent` may send commands to the trainer from its own thread.
StoringSink run(const core::TrainerOptions& options,
                const std::function<void(core::Trainer&, const core::Event&)>& react = {}) {
    struct Reacting final : core::EventSink {
        StoringSink store;
        core::Trainer* trainer = nullptr;
        std::function<void(core::Trainer&, const core::Event&)> react;
        void onEvent(const core::Event& event) override {
            store.onEvent(event);
            if (react && trainer) react(*trainer, event);
        }
    } sink;
    sink.react = react;
    core::Trainer trainer(options, sink);
    sink.trainer = &trainer;
    const core::RunResult result = trainer.run();
    if (result.state == core::RunState::Failed) throw std::runtime_error("benchmark run failed: " + result.error);
    return sink.store;
}

/// A model setup for the what-if measurement.
struct Setup {
    std::string name;
    core::TrainerOptions options;  ///< with the device whose probe fits the memory model
};

core::TrainerOptions model(const std::string& name, int64_t width, int64_t side, const std::string& device) {
    core::TrainerOptions o;
    o.model.name = name;
    o.model.width = width;
    o.data.samples = 4096;
    o.data.height = o.data.width = side;
    o.device = device;
    o.targetBatch = 1024;
    o.steps = 4;
    o.seed = 1;
    o.probe.headroom = 0;
    return o;
}

}  // namespace

int run(int argc, char** argv) try {
    const auto args =
        bench::parseArgs(argc, argv, "batchpilot-bench-insight",
                         "Cost of the teaching instrumentation and the equivalence check; what-if accuracy.");
    core::installCountingAllocator();
    const auto started = Clock::now();
    nlohmann::json report;
    report["bench"] = "insight";
    report["torch_version"] = TORCH_VERSION;
    report["machine"] = bench::machineDescription();
    std::vector<std::string> rows;

    // (1) Instrumentation overhead, interleaved, alternating which goes first.
    const int reps = args.quick ? 2 : 6;
    const int64_t steps = args.quick ? 3 : 7;
    core::TrainerOptions plain = bench::cnnWorkload("virtual:40MiB/exact", 256, 32, steps);
    core::TrainerOptions teaching = plain;
    teaching.reportGradientNorm = true;
    teaching.reportSampleIndices = true;
    std::vector<double> off, on, paired;
    for (int rep = 0; rep < reps; ++rep) {
        double a = 0, b = 0;
        if (rep % 2 == 0) {
            a = bench::runTrainer(plain).samplesPerSecond;
            b = bench::runTrainer(teaching).samplesPerSecond;
        } else {
            b = bench::runTrainer(teaching).samplesPerSecond;
            a = bench::runTrainer(plain).samplesPerSecond;
        }
        off.push_back(a);
        on.push_back(b);
        paired.push_back(b / a);
        rows.push_back("instrumentation," + std::to_string(rep + 1) + "," + bench::fixed(a, 2) + "," +
                       bench::fixed(b, 2) + "," + bench::fixed(b / a, 4));
        std::printf("rep %d: instrumentation off %.1f, on %.1f samples/s (ratio %.3f)\n", rep + 1, a, b, b / a);
        std::fflush(stdout);
    }
    report["instrumentation"] = {{"workload", "cnn width 32, 3x32x32, virtual:40MiB/exact, target 256, micro-batch 32"},
                                 {"off_samples_per_s", off},
                                 {"on_samples_per_s", on},
                                 {"ratio_of_medians", bench::median(on) / bench::median(off)},
                                 {"median_paired_ratio", bench::median(paired)}};

    // (2) The equivalence check's cost, in steps of the same batch (8 micro-batches of 32).
    std::vector<double> checkInSteps;
    double checkSeconds = 0;
    for (int rep = 0; rep < (args.quick ? 1 : 3); ++rep) {
        core::TrainerOptions o = bench::cnnWorkload("virtual:40MiB/exact", 256, 32, 4);
        bool asked = false;
        const StoringSink sink = run(o, [&](core::Trainer& trainer, const core::Event& e) {
            if (std::holds_alternative<core::OptimizerStepped>(e) && !asked) {
                asked = true;
                trainer.checkEquivalence(0);
            }
        });
        const auto checks = sink.all<core::EquivalenceChecked>();
        const auto metrics = sink.all<core::StepMetrics>();
        if (checks.size() != 1 || !checks.front().error.empty() || metrics.size() < 3) {
            throw std::runtime_error("the equivalence check did not run");
        }
        // Steps 2.. run the plan only (step 1 holds the probe's trial).
        double stepSeconds = 0;
        for (size_t i = 1; i < metrics.size(); ++i) stepSeconds += metrics[i].stepSeconds;
        stepSeconds /= static_cast<double>(metrics.size() - 1);
        checkSeconds = checks.front().seconds;
        checkInSteps.push_back(checks.front().seconds / stepSeconds);
        rows.push_back("equivalence," + std::to_string(rep + 1) + "," + bench::fixed(checks.front().seconds, 4) + "," +
                       bench::fixed(stepSeconds, 4) + "," + bench::fixed(checkInSteps.back(), 3));
        std::printf("equivalence check %.3f s = %.2f training steps (relative difference %.2g)\n",
                    checks.front().seconds, checkInSteps.back(), checks.front().overall.relativeDifference);
    }
    report["equivalence"] = {{"workload", "cnn width 32, 256 samples as 8 micro-batches of 32, virtual:40MiB/exact"},
                             {"check_in_steps", checkInSteps},
                             {"median_check_in_steps", bench::median(checkInSteps)},
                             {"last_check_seconds", checkSeconds}};

    // (3) What-if accuracy and breakdown coverage.
    std::vector<Setup> setups{
        {"mlp 3x32x32, virtual:16MiB/exact", model("mlp", 32, 32, "virtual:16MiB/exact")},
        {"cnn 3x32x32, virtual:64MiB/exact", model("cnn", 16, 32, "virtual:64MiB/exact")},
        {"resnet (GroupNorm) 3x64x64, virtual:128MiB/exact", model("resnet", 16, 64, "virtual:128MiB/exact")}};
    if (args.quick) setups.resize(1);
    double worstPrediction = 0;
    double worstCoverage = 0;
    for (const Setup& setup : setups) {
        const StoringSink probed = run(setup.options);
        const auto finished = probed.all<core::ProbeFinished>();
        if (finished.empty() || finished.front().bytesPerSample <= 0)
            throw std::runtime_error(setup.name + ": no memory fit");
        const core::ProbeFinished fit = finished.front();
        nlohmann::json entry = {{"setup", setup.name},
                                {"chosen_micro_batch", fit.microBatch},
                                {"fixed_bytes", fit.fixedBytes},
                                {"bytes_per_sample", fit.bytesPerSample}};
        for (const double factor : {0.25, 0.5, 1.0, 2.0}) {
            const auto m =
                std::max<int64_t>(1, static_cast<int64_t>(std::lround(factor * static_cast<double>(fit.microBatch))));
            core::TrainerOptions o = setup.options;
            o.device = "virtual:4GiB/exact";  // room for twice the chosen size
            o.targetBatch = 2 * m;
            o.steps = 3;
            o.probe.initialMicroBatch = m;
            o.probe.maxMicroBatch = m;
            o.probe.objective = core::ProbeObjective::Largest;  // exactly m
            const core::MemoryBreakdown b = run(o).all<core::MemoryBreakdown>().back();
            const double predicted = fit.fixedBytes + fit.bytesPerSample * static_cast<double>(m);
            const double error = (predicted - static_cast<double>(b.peakBytes)) / static_cast<double>(b.peakBytes);
            const double coverage = static_cast<double>(b.attributedBytes()) / static_cast<double>(b.peakBytes);
            worstPrediction = std::max(worstPrediction, std::abs(error));
            worstCoverage = std::max(worstCoverage, std::abs(coverage - 1.0));
            entry["sizes"].push_back({{"micro_batch", m},
                                      {"factor", factor},
                                      {"predicted_peak_bytes", predicted},
                                      {"measured_peak_bytes", b.peakBytes},
                                      {"prediction_error", error},
                                      {"parts_over_peak", coverage}});
            rows.push_back("what-if," + setup.name + " x" + bench::fixed(factor, 2) + "," + bench::fixed(predicted, 0) +
                           "," + std::to_string(b.peakBytes) + "," + bench::fixed(error, 4));
            std::printf(
                "%s, micro-batch %lld (x%.2f): predicted %.2f MiB, measured %.2f MiB (%+.1f%%), parts %.1f%% of peak\n",
                setup.name.c_str(), static_cast<long long>(m), factor, predicted / 1048576.0,
                static_cast<double>(b.peakBytes) / 1048576.0, 100 * error, 100 * coverage);
            std::fflush(stdout);
        }
        report["what_if"].push_back(entry);
    }
    report["worst_prediction_error"] = worstPrediction;
    report["worst_parts_deviation"] = worstCoverage;
    report["seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
    bench::writeJson(args.outDir, "insight.json", report);
    bench::writeCsv(args.outDir, "insight.csv", "part,case,a,b,ratio_or_error", rows);
    std::printf("insight: instrumentation on/off %.3f, check = %.2f steps, worst what-if error %.1f%%, %.1f s\n",
                report["instrumentation"]["ratio_of_medians"].get<double>(), bench::median(checkInSteps),
                100 * worstPrediction, report["seconds"].get<double>());
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "batchpilot-bench-insight: %s\n", e.what());
    return 1;
}

}  // namespace bench_insight

BATCHPILOT_BENCH_MAIN("batchpilot-bench-insight", bench_insight::run)
