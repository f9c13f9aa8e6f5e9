// batchpilot-bench-probe: probe accuracy and cost. For every model × virtual GPU budget, finds
// the true largest micro-batch with a plain training loop (yardstick/plain_loop.h), runs BatchPilot's probe in a real
// Trainer, and runs BatchPilot's probe search and the baseline strategies against the same cached trials. Writes
// probe.json, probe.csv (one row per setup and strategy) and probe_trials.csv (every measured trial).
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>

#include <torch/version.h>

#include "bench/bench_util.h"
#include "bench/probe_strategies.h"
#include "bench/trial_runner.h"
#include "core/device/counting_allocator.h"
#include "core/train/trainer.h"
#include "yardstick/plain_loop.h"
#include "bench/bench_main.h"

namespace bench_probe {

namespace {

using namespace batchpilot;
using bench::ProbeSetup;
using Clock = std::chrono::steady_clock;

constexpr int64_t kMiB = 1024 * 1024;

/// BatchPilot's probe inside a real Trainer at target batch = the upper bound, stopped when the
/// probe finishes. Samples are accounted from the trainer's own events.
struct TrainerProbe {
    int64_t found = 0;
    int trials = 0;
    int ooms = 0;
    double seconds = 0;
    int64_t samplesDiscarded = 0;
    std::string error;
};

class ProbeSink final : public core::EventSink {
public:
    void onEvent(const core::Event& event) override {
        if (const auto* trial = std::get_if<core::ProbeTrial>(&event)) {
            ++result.trials;
            if (trial->fit) {
                pendingFit = trial->microBatch;
            } else {
                ++result.ooms;
                // The samples of an OOM trial are replayed when the next micro-batch starts at
                // the same offset; checked when that micro-batch is done.
                pendingOom.push_back({trial->microBatch, committedSamples});
            }
        } else if (const auto* done = std::get_if<core::MicroBatchDone>(&event)) {
            if (done->index == 0 && committedSamples > 0) {
                // The batch started over (an OOM in backward): what it had committed is trained
                // again, the compute spent on it lost; the failed trial's samples are in the redo.
                result.samplesDiscarded += committedSamples;
                committedSamples = 0;
                pendingOom.clear();
            }
            if (pendingFit) {
                // A fitting trial whose gradients were not kept would show no probe-trial
                // micro-batch of its size here.
                if (!(done->probeTrial && done->size == *pendingFit)) result.samplesDiscarded += *pendingFit;
                pendingFit.reset();
            }
            for (const auto& [size, offset] : pendingOom) {
                if (done->offset != offset) result.samplesDiscarded += size;
            }
            pendingOom.clear();
            committedSamples += done->size;
        } else if (const auto* finished = std::get_if<core::ProbeFinished>(&event)) {
            result.found = finished->microBatch;
            result.seconds = finished->seconds;
            probeDone = true;
        } else if (const auto* error = std::get_if<core::ErrorEvent>(&event)) {
            result.error = error->message;
        }
        // Stop once the probe is over and its last trial is accounted for.
        if (probeDone && !pendingFit && pendingOom.empty() && trainer) trainer->stop();
    }
    TrainerProbe result;
    core::Trainer* trainer = nullptr;

private:
    std::optional<int64_t> pendingFit;
    std::vector<std::pair<int64_t, int64_t>> pendingOom;  // size, offset it must be replayed at
    int64_t committedSamples = 0;
    bool probeDone = false;
};

TrainerProbe runTrainerProbe(const ProbeSetup& s, double headroom) {
    core::TrainerOptions options = s.trainerOptions();
    // Room for every trial of the probe in the first training batch; the run stops when the
    // probe is over.
    options.targetBatch = 4 * s.upperBound;
    options.data.samples = 4 * s.upperBound;
    options.probe.maxMicroBatch = s.upperBound;
    options.probe.objective = core::ProbeObjective::Largest;  // the memory search alone is measured
    options.steps.reset();                                    // ProbeSink stops the run
    options.probe.headroom = headroom;
    ProbeSink sink;
    core::Trainer trainer(options, sink);
    sink.trainer = &trainer;
    trainer.run();
    return sink.result;
}

nlohmann::json toJson(const bench::StrategyResult& r, int64_t truth) {
    std::vector<int64_t> sizes;
    std::vector<bool> fits;
    for (const auto& t : r.trials) {
        sizes.push_back(t.outcome.size);
        fits.push_back(t.outcome.fit);
    }
    return {{"name", r.name},
            {"found", r.found},
            {"found_over_true", truth > 0 ? static_cast<double>(r.found) / static_cast<double>(truth) : 0.0},
            {"fits", r.found >= 1 && r.found <= truth},
            {"trials", r.trials.size()},
            {"ooms", r.ooms()},
            {"seconds", r.seconds()},
            {"samples_discarded", r.samplesDiscarded()},
            {"sizes", sizes},
            {"trial_fits", fits}};
}

}  // namespace

int run(int argc, char** argv) {
    const auto args = bench::parseArgs(argc, argv, "batchpilot-bench-probe",
                                       "Probe accuracy and cost against the baseline strategies.");
    core::installCountingAllocator();
    const auto started = Clock::now();
    nlohmann::json report;
    report["bench"] = "probe";
    report["torch_version"] = TORCH_VERSION;
    report["machine"] = bench::machineDescription();
    std::vector<std::string> rows;
    std::vector<std::string> trialRows;
    for (const ProbeSetup& s : bench::probeSetups(args.quick)) {
        const auto setupStarted = Clock::now();
        bench::TrialRunner runner(s);
        // The truth is the plain training loop's (yardstick/plain_loop.h), not the trainer's:
        // BatchPilot is judged by what a loop it did not write fits on the same budget.
        const bench::TrueMaximum trialTruth = bench::findTrueMaximum(runner);
        const bench::TrueMaximum truth{yardstick::plainLoopLargest(bench::plainLoopSetup(s), s.upperBound),
                                       trialTruth.checks};
        // BatchPilot in the real trainer, default options and headroom 0, interleaved with the
        // replays below only by setup: each is one probe.
        const TrainerProbe real = runTrainerProbe(s, core::ProbeOptions{}.headroom);
        const TrainerProbe realNoHeadroom = runTrainerProbe(s, 0.0);
        const bench::ProbeLimits limits{s.upperBound, s.budgetBytes};
        const auto strategies = bench::runAllStrategies(limits, [&](int64_t n) {
            const bench::Trial& t = runner.run(n);
            return bench::TrialOutcome{t.size, t.fit, t.peakBytes, t.seconds};
        });
        // The truth must agree with every trial measured for any strategy.
        int64_t largestFit = 0;
        for (const auto& [size, trial] : runner.cache()) {
            if (trial.fit) largestFit = std::max(largestFit, size);
        }
        nlohmann::json config = {{"setup", s.label},
                                 {"model", s.model.name},
                                 {"width", s.model.width},
                                 {"input", "3x" + std::to_string(s.data.height) + "x" + std::to_string(s.data.width)},
                                 {"budget_bytes", s.budgetBytes},
                                 {"upper_bound", s.upperBound},
                                 {"true_max", truth.size},
                                 {"trainer_trial_max", trialTruth.size},
                                 {"truth_checks", truth.checks},
                                 {"truth_consistent", largestFit == trialTruth.size},
                                 {"trials_measured", runner.measured()},
                                 {"seconds", std::chrono::duration<double>(Clock::now() - setupStarted).count()}};
        for (const auto& [label, probe] :
             {std::pair{"trainer_default", real}, std::pair{"trainer_headroom0", realNoHeadroom}}) {
            config[label] = {{"found", probe.found},
                             {"found_over_true", truth.size > 0 ? double(probe.found) / double(truth.size) : 0.0},
                             {"trials", probe.trials},
                             {"ooms", probe.ooms},
                             {"seconds", probe.seconds},
                             {"samples_discarded", probe.samplesDiscarded},
                             {"error", probe.error}};
        }
        for (const auto& r : strategies) {
            config["strategies"].push_back(toJson(r, truth.size));
            rows.push_back(s.label + "," + std::to_string(s.budgetBytes / kMiB) + "," + std::to_string(truth.size) +
                           ",\"" + r.name + "\"," + std::to_string(r.found) + "," +
                           bench::fixed(truth.size > 0 ? 100.0 * double(r.found) / double(truth.size) : 0.0, 1) + "," +
                           std::to_string(r.trials.size()) + "," + std::to_string(r.ooms()) + "," +
                           bench::fixed(r.seconds(), 3) + "," + std::to_string(r.samplesDiscarded()));
        }
        for (const auto& [size, t] : runner.cache()) {
            trialRows.push_back(s.label + "," + std::to_string(s.budgetBytes / kMiB) + "," + std::to_string(size) +
                                "," + (t.fit ? "1" : "0") + "," + std::to_string(t.peakBytes) + "," +
                                bench::fixed(t.seconds, 4));
        }
        report["configs"].push_back(config);
        std::printf("%-18s %4lld MiB  true %5lld  trainer %5lld/%5lld  (%d trials measured, %.1f s)\n", s.label.c_str(),
                    static_cast<long long>(s.budgetBytes / kMiB), static_cast<long long>(truth.size),
                    static_cast<long long>(real.found), static_cast<long long>(realNoHeadroom.found), runner.measured(),
                    config["seconds"].get<double>());
        std::fflush(stdout);
    }
    report["seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
    bench::writeJson(args.outDir, "probe.json", report);
    bench::writeCsv(args.outDir, "probe.csv",
                    "setup,budget_mib,true_max,strategy,found,found_pct_of_true,trials,ooms,probe_s,samples_discarded",
                    rows);
    bench::writeCsv(args.outDir, "probe_trials.csv", "setup,budget_mib,micro_batch,fit,peak_bytes,trial_s", trialRows);
    std::printf("probe benchmark: %.1f s\n", report["seconds"].get<double>());
    return 0;
}

}  // namespace bench_probe

BATCHPILOT_BENCH_MAIN("batchpilot-bench-probe", bench_probe::run)
