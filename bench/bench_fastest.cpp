// batchpilot-bench-fastest: how close the probe objective "fastest" comes to the fastest
// micro-batch, and what finding it costs (issue 16). For each of the 12 probe setups and a
// TorchScript model: the largest micro-batch that fits (the probe); the throughput of a sweep of
// fitting sizes, each measured in its own run with the micro-batch pinned; then runs with the
// objective "fastest" until it decides. Writes fastest.json and fastest.csv.
//
// Ratios, not absolute speeds, all measured in this one process. The sweep measures every size
// in rounds that interleave the sizes (the best of the rounds counts) to find the best size; then
// each size the search chose, and the largest, is scored against that best size measured in
// turns (best, size, best, size, …), so that the machine's drift, larger than the differences
// between neighbouring sizes on a shared machine, cannot flatter or wrong it; a lucky timing
// inside the search cannot flatter it either. A size that runs out of memory while training
// scores 0.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

#include <torch/version.h>

#include "bench/bench_util.h"
#include "bench/trainer_workload.h"
#include "bench/trial_runner.h"
#include "core/device/counting_allocator.h"
#include "core/plan/throughput_search.h"
#include "core/train/trainer.h"
#include "bench/bench_main.h"

namespace bench_fastest {

namespace {

using namespace batchpilot;
using Clock = std::chrono::steady_clock;

struct Case {
    std::string label;
    core::TrainerOptions options;  ///< model, data, device, target batch
};

/// The target batch of a setup: the training batch a user of such a model would ask for, small
/// enough that a sweep of sizes stays within minutes on two cores.
int64_t targetFor(const bench::ProbeSetup& s) {
    if (s.model.name != "resnet") return 1024;
    return s.data.height >= 224 ? 64 : 256;
}

std::vector<Case> cases(bool quick, const std::string& torchscript, const std::string& device) {
    std::vector<Case> out;
    for (const bench::ProbeSetup& s : bench::probeSetups(quick)) {
        core::TrainerOptions o = s.trainerOptions();
        o.targetBatch = targetFor(s);
        o.data.samples = std::max<int64_t>(4096, 8 * o.targetBatch);
        o.optimizer.learningRate = 0.01;
        out.push_back({s.label + ", " + std::to_string(s.budgetBytes / (1024 * 1024)) + " MiB", o});
    }
    if (!torchscript.empty()) {
        core::TrainerOptions o = bench::cnnWorkload("virtual:256MiB/exact", 1024, 0, 1);
        o.model.name = torchscript;
        o.optimizer.learningRate = 0.01;
        const std::string file = torchscript.substr(torchscript.find_last_of('/') + 1);
        out.push_back({"TorchScript " + file.substr(0, file.rfind('.')) + " 3x32x32, 256 MiB", o});
    }
    if (!device.empty()) {
        // A real device instead of the virtual budgets (the GPU check): its memory decides.
        for (Case& c : out) {
            c.options.device = device;
            c.label = c.label.substr(0, c.label.find(',')) + ", " + device;
        }
        if (quick) out.resize(std::min<size_t>(out.size(), 2));
    }
    return out;
}

/// The largest micro-batch that fits: the probe of a run with the objective "largest".
int64_t largestFit(const Case& c) {
    core::TrainerOptions o = c.options;
    o.probe.objective = core::ProbeObjective::Largest;
    o.steps = 50;  // a probe may need more trials than one training batch holds; stopped when it ends
    const auto run = bench::runEvents(o, [](const core::Event& e, core::Trainer& trainer) {
        if (std::holds_alternative<core::ProbeFinished>(e)) trainer.stop();
    });
    for (const core::Event& e : run.events)
        if (const auto* f = std::get_if<core::ProbeFinished>(&e)) return f->microBatch;
    throw std::runtime_error(c.label + ": no probe finished");
}

/// Samples per second over steps 2..N with the micro-batch pinned to `size`, N at least `steps`
/// and enough for `minSeconds` of counted training (a fast model's step is a few milliseconds:
/// four of them would be mostly noise); 0 when the size ran out of memory while training
/// (recovered at a smaller size: not a rate of `size`).
double measure(const Case& c, int64_t size, int64_t steps, double minSeconds = 1.0) {
    core::TrainerOptions o = c.options;
    o.probe.initialMicroBatch = o.probe.maxMicroBatch = size;
    o.probe.objective = core::ProbeObjective::Largest;
    o.steps = 100000;  // stopped below
    double firstEnd = -1;
    const auto run = bench::runEvents(o, [&](const core::Event& e, core::Trainer& trainer) {
        const auto* m = std::get_if<core::StepMetrics>(&e);
        if (!m) return;
        if (m->step == 1) firstEnd = m->time;
        if (m->step >= steps && firstEnd >= 0 && m->time - firstEnd >= minSeconds) trainer.stop();
    });
    for (const core::Event& e : run.events)
        if (std::holds_alternative<core::OomEvent>(e)) return 0;
    return bench::throughputOf(run.events, size).samplesPerSecond;
}

/// The best of `rounds` measurements: interference from the rest of the machine only slows a
/// run down, so the fastest of a few is the closest to the size's own speed.
double bestOf(const std::vector<double>& rates) {
    return rates.empty() ? 0 : *std::max_element(rates.begin(), rates.end());
}

/// `size` against `best`, measured in turns — best, size, best, size, best, size, best — each
/// run as in measure(): the median over the three of size's rate divided by the mean of the two
/// best-rates around it. A shared machine's speed drifts by more than neighbouring sizes differ
/// (seen: ±10% between two runs of one size a minute apart); in turns, the drift slows both alike.
/// Capped at 1: a size that beats the sweep's best in turns was the best itself.
struct Paired {
    double raw = 0;              ///< the median ratio, uncapped
    std::vector<double> ratios;  ///< one per turn
    double ratio() const { return std::min(1.0, raw); }
};

Paired pairedRatio(const Case& c, int64_t size, int64_t best, int64_t steps, int turns) {
    Paired out;
    if (size == best) {
        out.raw = 1;
        return out;
    }
    double before = measure(c, best, steps);
    for (int i = 0; i < turns; ++i) {
        const double mine = measure(c, size, steps);
        const double after = measure(c, best, steps);
        const double around = 0.5 * (before + after);
        out.ratios.push_back(around > 0 ? mine / around : 0);
        before = after;
    }
    out.raw = bench::median(out.ratios);
    return out;
}

/// The sweep: the search's own candidates (halvings, each an even split of the target) and,
/// between them, every size that splits the target into k equal micro-batches for k = 3, 6, 12,
/// 24, … — twice as dense — down to a floor of target/256 samples (at least 1).
std::vector<int64_t> sweepSizes(int64_t largest, int64_t target) {
    std::set<int64_t> sizes;
    const int64_t floor = std::max<int64_t>(1, target / 256);
    for (int64_t n : core::throughputCandidates(largest, target, 1, 1))
        if (n >= floor) sizes.insert(n);
    for (int64_t k = 3; k <= 4 * target; k *= 2) {
        const int64_t n = (target + k - 1) / k;
        if (n <= largest && n >= floor) sizes.insert(n);
    }
    return {sizes.rbegin(), sizes.rend()};
}

struct Search {
    int64_t chosen = 0;
    int64_t largest = 0;
    int timed = 0;
    double seconds = 0;
    int64_t samplesTimed = 0;            ///< samples trained while the search timed
    std::map<int64_t, double> measured;  ///< the search's own median samples/s per size
    double claimedMicroBatchGain = 0;    ///< ThroughputChosen::speedOverLargest
    double claimedStepGain = 0;          ///< ThroughputChosen::stepSpeedOverLargest
    std::vector<double> batchRatios;     ///< ThroughputChosen::batchRatios: the check on whole batches
    double batchGainLow = 0;             ///< … and where their median lies with 95% confidence
    double batchGainHigh = 0;
    double checkSeconds = 0;
    int64_t searched = 0;  ///< the size the search chose before that check (its last timed size)
    /// The check's batches (each step after the search's last timing): largest micro-batch, samples/s.
    std::vector<std::pair<int64_t, double>> checkBatches;
    std::string reason;
};

/// A run with the objective "fastest", stopped one step after its decision.
Search runFastest(const Case& c) {
    core::TrainerOptions o = c.options;
    o.probe.objective = core::ProbeObjective::Fastest;
    o.steps = 400;  // an upper limit: the hook stops the run one whole step after the decision
    bool decided = false;
    const auto run = bench::runEvents(o, [&](const core::Event& e, core::Trainer& trainer) {
        if (std::holds_alternative<core::ThroughputChosen>(e)) decided = true;
        if (decided && std::holds_alternative<core::StepMetrics>(e)) trainer.stop();
    });
    Search s;
    // Samples trained between the probe's end and the decision: the timed micro-batches and the
    // rest of batches split around them.
    bool timing = false;
    std::map<int64_t, int64_t> largestPart;  // per step since the search's last timing: its largest micro-batch
    for (const core::Event& e : run.events) {
        if (std::holds_alternative<core::ProbeFinished>(e)) timing = s.chosen == 0;
        if (const auto* done = std::get_if<core::MicroBatchDone>(&e); done && timing && !done->probeTrial) {
            s.samplesTimed += done->size;
            largestPart[done->step] = std::max(largestPart[done->step], done->size);
        }
        if (std::holds_alternative<core::ThroughputTimed>(e)) {
            largestPart.clear();
            s.checkBatches.clear();
        }
        if (const auto* m = std::get_if<core::StepMetrics>(&e); m && timing)
            s.checkBatches.emplace_back(largestPart.count(m->step) ? largestPart[m->step] : 0, m->samplesPerSecond);
        if (const auto* t = std::get_if<core::ThroughputTimed>(&e); t && t->repetitions > 0)
            s.measured[t->microBatch] = t->samplesPerSecond;
        if (const auto* d = std::get_if<core::ThroughputChosen>(&e)) {
            timing = false;
            s.chosen = d->microBatch;
            s.largest = d->largestMicroBatch;
            s.timed = d->microBatchesTimed;
            s.seconds = d->seconds;
            s.claimedMicroBatchGain = d->speedOverLargest;
            s.claimedStepGain = d->stepSpeedOverLargest;
            s.batchRatios = d->batchRatios;
            s.batchGainLow = d->batchGainLow;
            s.batchGainHigh = d->batchGainHigh;
            s.checkSeconds = d->checkSeconds;
            s.reason = d->reason;
            // The size the check compared with the largest: the other size of its whole batches
            // (the batch the search ended in is mixed; only a later one is whole).
            if (!s.batchRatios.empty()) {
                for (const auto& [step, size] : largestPart)
                    if (size != s.largest && step != largestPart.begin()->first) s.searched = size;
            }
        }
    }
    if (s.chosen == 0) {
        // Only one size to choose from: nothing was timed, the largest is used.
        for (const core::Event& e : run.events)
            if (const auto* f = std::get_if<core::ProbeFinished>(&e)) s.chosen = s.largest = f->microBatch;
    }
    return s;
}

/// What runDemoSwitch measured: median samples/s of the steps in each phase.
struct DemoSwitch {
    double before = 0;        ///< samples/s: steps after the first decision, before the switch
    double during = 0;        ///< samples/s: from the switch to the second decision (re-probe and search)
    double after = 0;         ///< samples/s: steps after the second decision
    int64_t searchSteps = 0;  ///< steps from the switch to the second decision
    int64_t microBefore = 0;
    int64_t microAfter = 0;
    std::vector<std::string> reasons;               ///< each decision of the search, in words
    std::vector<std::pair<int64_t, double>> timed;  ///< each counted timing: size, median so far
};

/// The desktop demo's experiment (issue 16): cnn, target 1024, Adam, 64 MiB, switched to 256 MiB
/// after step `switchAt` (which re-probes and, for "fastest", searches again). Runs until `settled` steps after the
/// second decision (the probe's end for "largest"), so "after" is what the user then sees.
DemoSwitch runDemoSwitch(core::ProbeObjective objective, bool quick) {
    const int64_t switchAt = quick ? 8 : 14;
    const int64_t settled = quick ? 4 : 10;
    const int64_t cap = quick ? 60 : 120;
    core::TrainerOptions o = bench::cnnWorkload("virtual:64MiB/exact", 1024, 0, cap);
    o.optimizer.kind = core::OptimizerKind::Adam;
    o.optimizer.learningRate = 0.003;
    o.probe.objective = objective;
    int64_t lastStep = 0;
    int64_t decidedIn = 0;  // the step in which the second decision fell
    const auto run = bench::runEvents(o, [&](const core::Event& e, core::Trainer& trainer) {
        if (const auto* m = std::get_if<core::StepMetrics>(&e)) {
            lastStep = m->step;
            if (m->step == switchAt) trainer.switchDevice("virtual:256MiB/exact");
            if (decidedIn > 0 && m->step >= decidedIn + settled) trainer.stop();
        }
        const bool second =
            objective == core::ProbeObjective::Fastest
                ? std::holds_alternative<core::ThroughputChosen>(e) && std::get<core::ThroughputChosen>(e).sequence == 2
                : std::holds_alternative<core::ProbeFinished>(e) && std::get<core::ProbeFinished>(e).sequence == 2;
        if (second) decidedIn = lastStep + 1;
    });
    std::vector<double> before, during, after;
    DemoSwitch out;
    for (const core::Event& e : run.events) {
        if (const auto* c = std::get_if<core::ThroughputChosen>(&e)) out.reasons.push_back(c->reason);
        if (const auto* t = std::get_if<core::ThroughputTimed>(&e); t && t->repetitions > 0)
            out.timed.emplace_back(t->microBatch, t->samplesPerSecond);
        const auto* m = std::get_if<core::StepMetrics>(&e);
        if (!m) continue;
        if (m->step > switchAt / 2 && m->step <= switchAt) {
            before.push_back(m->samplesPerSecond);
            out.microBefore = m->microBatch;
        } else if (m->step > switchAt && (decidedIn == 0 || m->step <= decidedIn)) {
            during.push_back(m->samplesPerSecond);
        } else if (decidedIn > 0 && m->step > decidedIn) {
            after.push_back(m->samplesPerSecond);
            out.microAfter = m->microBatch;
        }
    }
    out.before = bench::median(before);
    out.during = bench::median(during);
    out.after = bench::median(after);
    out.searchSteps = decidedIn > 0 ? decidedIn - switchAt : -1;
    return out;
}

/// --claims: for each case, `searches` runs of the search; each decision below the largest has its
/// claim per training batch checked against whole batches of the two sizes measured in turns.
int claims(const bench::BenchArgs& args, const std::vector<Case>& all, const std::string& only, int searches,
           int64_t steps, int turns, nlohmann::json report) {
    report["claims_only"] = true;
    std::vector<std::string> rows;
    // --only A|B: the cases whose name holds A or B.
    const auto wanted = [&only](const std::string& label) {
        if (only.empty()) return true;
        for (size_t start = 0; start <= only.size();) {
            const size_t bar = std::min(only.find('|', start), only.size());
            if (label.find(only.substr(start, bar - start)) != std::string::npos) return true;
            start = bar + 1;
        }
        return false;
    };
    for (const Case& c : all) {
        if (!wanted(c.label)) continue;
        const int64_t largestSize = core::throughputCandidates(largestFit(c), c.options.targetBatch, 1, 1).front();
        nlohmann::json config = {
            {"setup", c.label}, {"target_batch", c.options.targetBatch}, {"largest_size", largestSize}};
        for (int i = 0; i < searches; ++i) {
            const Search s = runFastest(c);
            nlohmann::json row = {{"chosen", s.chosen},
                                  {"largest", largestSize},
                                  {"claimed_micro_batch_gain", s.claimedMicroBatchGain},
                                  {"claimed_step_gain", s.claimedStepGain},
                                  {"seconds", s.seconds},
                                  {"reason", s.reason}};
            // Checked on whole batches before the decision (probe.check_seconds): the turns' ratios,
            // and whether they overturned the search's choice (the largest kept after all).
            if (!s.batchRatios.empty()) {
                row["batch_ratios"] = s.batchRatios;
                row["claimed_interval"] = {s.batchGainLow, s.batchGainHigh};
                row["check_seconds"] = s.checkSeconds;
                row["overturned"] = s.chosen == largestSize;
                row["checked_size"] = s.searched;
                row["check_batches"] = s.checkBatches;
            }
            if (s.chosen == largestSize && s.searched > 0 && s.searched != largestSize) {
                // Overturned by the check: was the checked size really no faster?
                row["checked_size_measured_step_gain"] = pairedRatio(c, s.searched, largestSize, steps, turns).raw;
                row["checked_size_batch_gain"] = bench::median(s.batchRatios);
            }
            if (s.chosen != largestSize && s.claimedStepGain > 0) {
                // Measured for each search, right after it: the references are as independent of
                // each other as the claims are.
                const Paired p = pairedRatio(c, s.chosen, largestSize, steps, turns);
                row["measured_step_gain"] = p.raw;
                row["measured_step_gain_turns"] = p.ratios;
                // How well the reference itself knows the gain: the same 95% interval of its median.
                const core::MedianInterval reference = core::medianInterval(p.ratios);
                row["measured_interval"] = {reference.low, reference.high};
                row["claim_error"] = s.claimedStepGain / p.raw - 1.0;
                row["micro_batch_claim_error"] = s.claimedMicroBatchGain / p.raw - 1.0;
                rows.push_back("\"" + c.label + "\"," + std::to_string(s.chosen) + "," + std::to_string(largestSize) +
                               "," + bench::fixed(s.claimedMicroBatchGain, 3) + "," +
                               bench::fixed(s.claimedStepGain, 3) + "," + bench::fixed(p.raw, 3));
            }
            std::printf(
                "%-38s chose %lld (largest %lld): claimed %.3fx per batch, %.3fx per micro-batch; measured "
                "%s\n",
                c.label.c_str(), static_cast<long long>(s.chosen), static_cast<long long>(largestSize),
                s.claimedStepGain, s.claimedMicroBatchGain,
                row.contains("measured_step_gain")
                    ? (bench::fixed(row["measured_step_gain"].get<double>(), 3) + "x per batch").c_str()
                    : (row.value("overturned", false)
                           ? ("the check's " + std::to_string(s.searched) + ": " +
                              bench::fixed(row.value("checked_size_batch_gain", 0.0), 3) + "x in the check, " +
                              bench::fixed(row.value("checked_size_measured_step_gain", 0.0), 3) +
                              "x per batch (the check kept the largest)")
                                 .c_str()
                           : "nothing (the largest was kept, or not timed)"));
            std::fflush(stdout);
            config["searches"].push_back(row);
        }
        report["configs"].push_back(config);
    }
    bench::writeJson(args.outDir, "fastest.json", report);
    bench::writeCsv(args.outDir, "fastest_claims.csv",
                    "setup,chosen,largest,claimed_micro_batch_gain,claimed_step_gain,measured_step_gain", rows);
    return 0;
}

}  // namespace

int run(int argc, char** argv) {
    // --torchscript MODEL.pt and --device DEV are this benchmark's own; the rest are every benchmark's.
    std::string torchscript;
    std::string device;
    std::string only;  // run the cases whose label contains this (trying one out)
    // --claims: no sweep; each search's claim per training batch against whole batches of the
    // chosen size and the largest, measured in turns (issue 38, item 10).
    bool claimsOnly = false;
    int turnsGiven = 0;     // --turns N: turns when scoring a size against another (default 3; 1 quick)
    int searchesGiven = 0;  // --searches N: runs of the search per case (default 3; 1 quick)
    std::vector<char*> rest{argv[0]};
    // A whole number from 1 to `most`, else -1 (a usage error below).
    const auto count = [](const char* text, long most) {
        char* end = nullptr;
        const long n = std::strtol(text, &end, 10);
        return *end == '\0' && n >= 1 && n <= most ? static_cast<int>(n) : -1;
    };
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--torchscript") == 0 && i + 1 < argc)
            torchscript = argv[++i];
        else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (std::strcmp(argv[i], "--claims") == 0)
            claimsOnly = true;
        else if (std::strcmp(argv[i], "--turns") == 0 && i + 1 < argc)
            turnsGiven = count(argv[++i], 50);
        else if (std::strcmp(argv[i], "--searches") == 0 && i + 1 < argc)
            searchesGiven = count(argv[++i], 100);
        else
            rest.push_back(argv[i]);
    }
    const auto args = bench::parseArgs(static_cast<int>(rest.size()), rest.data(), "batchpilot-bench-fastest",
                                       "The objective \"fastest\" against a sweep of micro-batch sizes (also takes "
                                       "--torchscript MODEL.pt, --device DEV to use one real device instead of "
                                       "the virtual budgets, --only TEXT for the cases whose name holds it, or "
                                       "\"demo\" for the demo's device switch alone, --claims to check only "
                                       "the decisions' claims per training batch, without the sweep, --turns N "
                                       "for the turns of each comparison in turns, 3 by default, and --searches N "
                                       "for the runs of the search per case, 3 by default).");
    if (turnsGiven < 0 || searchesGiven < 0) {
        std::fprintf(stderr, "batchpilot-bench-fastest: %s takes a whole number from 1 to %d\n",
                     turnsGiven < 0 ? "--turns" : "--searches", turnsGiven < 0 ? 50 : 100);
        return 2;
    }
    core::installCountingAllocator();
    const auto started = Clock::now();
    const int rounds = args.quick ? 1 : 2;  // sweep rounds, interleaving the sizes
    const int searches = searchesGiven > 0 ? searchesGiven : args.quick ? 1 : 3;  // runs of the search per case
    const int64_t steps = args.quick ? 3 : 5;  // per sweep measurement: steps 2..N count, at least 1 s
    const int turns = turnsGiven > 0 ? turnsGiven : args.quick ? 1 : 3;  // scoring a size against the best
    nlohmann::json report;
    report["bench"] = "fastest";
    report["torch_version"] = TORCH_VERSION;
    report["machine"] = bench::machineDescription();
    report["rounds"] = rounds;
    report["searches"] = searches;
    report["turns"] = turns;
    std::vector<std::string> rows;
    if (claimsOnly) return claims(args, cases(args.quick, torchscript, device), only, searches, steps, turns, report);
    for (const Case& c : cases(args.quick, torchscript, device)) {
        if (!only.empty() && c.label.find(only) == std::string::npos) continue;
        const auto caseStarted = Clock::now();
        const int64_t target = c.options.targetBatch;
        const int64_t largest = largestFit(c);
        const std::vector<int64_t> sizes = sweepSizes(largest, target);
        std::map<int64_t, std::vector<double>> rates;
        measure(c, sizes.front(), 2, 0.0);  // warms up the process for this model (kernels, caches)
        for (int round = 0; round < rounds; ++round) {
            // Large to small, then small to large: a slow drift of the machine cancels out.
            std::vector<int64_t> order = sizes;
            if (round % 2 == 1) std::reverse(order.begin(), order.end());
            for (int64_t n : order) rates[n].push_back(measure(c, n, steps));
        }
        std::vector<Search> runs;
        for (int i = 0; i < searches; ++i) runs.push_back(runFastest(c));
        // Sizes the search chose that the sweep did not measure are measured the same way now.
        for (const Search& s : runs)
            if (!rates.count(s.chosen))
                for (int round = 0; round < rounds; ++round) rates[s.chosen].push_back(measure(c, s.chosen, steps));

        std::map<int64_t, double> rate;
        for (const auto& [n, values] : rates) rate[n] = bestOf(values);
        int64_t best = sizes.front();
        for (const auto& [n, r] : rate)
            if (r > rate[best]) best = n;
        const int64_t largestSize = core::throughputCandidates(largest, target, 1, 1).front();
        if (!rate.count(largestSize)) rate[largestSize] = measure(c, largestSize, steps);
        // Each chosen size and the largest, scored against the sweep's best in turns.
        std::map<int64_t, Paired> paired;
        paired[largestSize] = pairedRatio(c, largestSize, best, steps, turns);
        for (const Search& s : runs)
            if (!paired.count(s.chosen)) paired[s.chosen] = pairedRatio(c, s.chosen, best, steps, turns);
        const double largestRatio = paired[largestSize].ratio();
        // A 100-step run at the best size: what the search's cost is compared with.
        const double hundredSteps = 100.0 * static_cast<double>(target) / rate[best];

        nlohmann::json config = {{"setup", c.label},
                                 {"model", c.options.model.name},
                                 {"device", c.options.device},
                                 {"target_batch", target},
                                 {"largest_fit", largest},
                                 {"largest_size", largestSize},
                                 {"best_size", best},
                                 {"best_samples_per_second", rate[best]},
                                 {"largest_over_best", largestRatio},
                                 {"hundred_step_seconds", hundredSteps}};
        for (const auto& [n, r] : rate) {
            config["sweep"].push_back({{"micro_batch", n}, {"samples_per_second", r}});
            if (rates.count(n)) config["sweep"].back()["rounds"] = rates[n];
        }
        // How far the sweep's two rounds of one size lie apart: the machine's own noise.
        std::vector<double> spreads;
        for (const auto& [n, values] : rates) {
            if (values.size() < 2) continue;
            const auto [low, high] = std::minmax_element(values.begin(), values.end());
            if (*high > 0) spreads.push_back((*high - *low) / (0.5 * (*high + *low)));
        }
        config["sweep_noise"] = spreads.empty() ? 0.0 : bench::median(spreads);
        for (const auto& [n, p] : paired)
            config["in_turns"].push_back(
                {{"micro_batch", n}, {"over_best", p.ratio()}, {"over_best_uncapped", p.raw}, {"turns", p.ratios}});
        double ratioSum = 0, worst = 1, costSum = 0;
        // The decision's claim, "the chosen size runs whole training batches N times as fast as the
        // largest", against whole batches of the two measured in turns (issue 38, item 10).
        std::map<int64_t, Paired> overLargest;
        for (const Search& s : runs) {
            if (s.chosen == largestSize || s.claimedStepGain <= 0 || overLargest.count(s.chosen)) continue;
            overLargest[s.chosen] = pairedRatio(c, s.chosen, largestSize, steps, turns);
        }
        for (const Search& s : runs) {
            const double ratio = paired[s.chosen].ratio();
            // Time lost to timing: the search's time minus what its samples take at the chosen size.
            const double cost =
                std::max(0.0, s.seconds - static_cast<double>(s.samplesTimed) / std::max(rate[s.chosen], 1e-9));
            ratioSum += ratio;
            worst = std::min(worst, ratio);
            costSum += cost;
            config["searches"].push_back({{"chosen", s.chosen},
                                          {"largest", largestSize},
                                          {"claimed_micro_batch_gain", s.claimedMicroBatchGain},
                                          {"claimed_step_gain", s.claimedStepGain},
                                          {"chosen_over_best", ratio},
                                          {"chosen_over_best_sweep", rate[s.chosen] / rate[best]},
                                          {"micro_batches_timed", s.timed},
                                          {"search_seconds", s.seconds},
                                          {"cost_seconds", cost},
                                          {"cost_share_of_100_steps", cost / hundredSteps},
                                          {"reason", s.reason}});
            if (overLargest.count(s.chosen)) {
                const double measured = overLargest[s.chosen].raw;
                auto& row = config["searches"].back();
                row["measured_step_gain"] = measured;
                row["measured_step_gain_turns"] = overLargest[s.chosen].ratios;
                row["claim_error"] = s.claimedStepGain / measured - 1.0;
                row["micro_batch_claim_error"] = s.claimedMicroBatchGain / measured - 1.0;
                std::printf(
                    "  chose %lld over %lld: claimed %.3fx per batch (%.3fx per micro-batch), measured %.3fx "
                    "per batch in turns: %+.1f%% (%+.1f%%)\n",
                    static_cast<long long>(s.chosen), static_cast<long long>(largestSize), s.claimedStepGain,
                    s.claimedMicroBatchGain, measured, 100.0 * (s.claimedStepGain / measured - 1.0),
                    100.0 * (s.claimedMicroBatchGain / measured - 1.0));
            }
            // What the search measured, next to the sweep: a systematic difference between timing
            // micro-batches and timing whole steps shows here.
            for (const auto& [size, r] : s.measured)
                config["searches"].back()["measured"].push_back(
                    {{"micro_batch", size},
                     {"samples_per_second", r},
                     {"sweep_samples_per_second", rate.count(size) ? rate[size] : 0.0}});
            rows.push_back("\"" + c.label + "\"," + std::to_string(target) + "," + std::to_string(largest) + "," +
                           std::to_string(best) + "," + bench::fixed(rate[best], 0) + "," + std::to_string(s.chosen) +
                           "," + bench::fixed(ratio, 3) + "," + bench::fixed(largestRatio, 3) + "," +
                           std::to_string(s.timed) + "," + bench::fixed(cost, 3) + "," +
                           bench::fixed(100.0 * cost / hundredSteps, 2));
        }
        const double meanRatio = ratioSum / static_cast<double>(runs.size());
        const double meanCost = costSum / static_cast<double>(runs.size());
        config["chosen_over_best_mean"] = meanRatio;
        config["chosen_over_best_worst"] = worst;
        config["cost_share_of_100_steps_mean"] = meanCost / hundredSteps;
        config["seconds"] = std::chrono::duration<double>(Clock::now() - caseStarted).count();
        report["configs"].push_back(config);
        std::printf(
            "%-38s T %5lld  fits %5lld  best %5lld (%7.0f/s)  fastest %.3f (worst %.3f)  largest %.3f  "
            "cost %.1f%% of 100 steps  (%.0f s)\n",
            c.label.c_str(), static_cast<long long>(target), static_cast<long long>(largest),
            static_cast<long long>(best), rate[best], meanRatio, worst, largestRatio, 100.0 * meanCost / hundredSteps,
            config["seconds"].get<double>());
        std::fflush(stdout);
    }
    // The demo's 64 MiB → 256 MiB switch, both objectives (virtual devices only), repeated in turns:
    // one run's after/before ratio moves by ~10% with this machine's noise, so the median of
    // several runs and their range are what is reported.
    const int demoRuns = args.quick ? 1 : 5;
    std::map<core::ProbeObjective, std::vector<DemoSwitch>> demos;
    for (int run = 0; run < demoRuns; ++run) {
        for (const auto objective : {core::ProbeObjective::Fastest, core::ProbeObjective::Largest}) {
            if (!device.empty() || (!only.empty() && only != "demo")) break;
            const DemoSwitch d = runDemoSwitch(objective, args.quick);
            std::printf(
                "demo %d/%d, 64 MiB -> 256 MiB, %-7s: %6.0f -> %6.0f samples/s (%.2fx), micro-batch %lld -> %lld; "
                "%lld steps to decide at %.0f samples/s\n",
                run + 1, demoRuns, core::toString(objective), d.before, d.after, d.after / d.before,
                static_cast<long long>(d.microBefore), static_cast<long long>(d.microAfter),
                static_cast<long long>(d.searchSteps), d.during);
            std::fflush(stdout);
            demos[objective].push_back(d);
        }
    }
    for (const auto& [objective, runs] : demos) {
        std::vector<double> before, during, after, ratio, steps;
        nlohmann::json each = nlohmann::json::array();
        for (const DemoSwitch& d : runs) {
            before.push_back(d.before);
            during.push_back(d.during);
            after.push_back(d.after);
            ratio.push_back(d.after / d.before);
            steps.push_back(static_cast<double>(d.searchSteps));
            each.push_back({{"samples_per_second_before", d.before},
                            {"samples_per_second_during", d.during},
                            {"samples_per_second_after", d.after},
                            {"after_over_before", d.after / d.before},
                            {"steps_to_decision", d.searchSteps},
                            {"micro_batch_before", d.microBefore},
                            {"micro_batch_after", d.microAfter},
                            {"decisions", d.reasons},
                            {"timings", d.timed}});
        }
        const DemoSwitch& last = runs.back();
        report["demo_switch"][core::toString(objective)] = {
            {"runs", static_cast<int64_t>(runs.size())},
            {"samples_per_second_before", bench::median(before)},
            {"samples_per_second_during", bench::median(during)},
            {"samples_per_second_after", bench::median(after)},
            {"steps_to_decision", static_cast<int64_t>(std::lround(bench::median(steps)))},
            {"after_over_before", bench::median(ratio)},
            {"after_over_before_min", *std::min_element(ratio.begin(), ratio.end())},
            {"after_over_before_max", *std::max_element(ratio.begin(), ratio.end())},
            {"micro_batch_before", last.microBefore},
            {"micro_batch_after", last.microAfter},
            {"each_run", each}};
        std::printf("demo, %-7s: after/before %.2f (median of %zu runs, %.2f to %.2f)\n", core::toString(objective),
                    bench::median(ratio), runs.size(), *std::min_element(ratio.begin(), ratio.end()),
                    *std::max_element(ratio.begin(), ratio.end()));
        std::fflush(stdout);
    }
    // Averages over the cases.
    double fastestSum = 0, largestSum = 0, costSum = 0, fastestWorst = 1, largestWorst = 1, costWorst = 0;
    std::vector<double> noises;
    int n = 0;
    for (const auto& config : report["configs"]) {
        fastestSum += config["chosen_over_best_mean"].get<double>();
        largestSum += config["largest_over_best"].get<double>();
        costSum += config["cost_share_of_100_steps_mean"].get<double>();
        fastestWorst = std::min(fastestWorst, config["chosen_over_best_worst"].get<double>());
        largestWorst = std::min(largestWorst, config["largest_over_best"].get<double>());
        costWorst = std::max(costWorst, config["cost_share_of_100_steps_mean"].get<double>());
        noises.push_back(config["sweep_noise"].get<double>());
        ++n;
    }
    report["summary"] = {{"cases", n},
                         {"fastest_over_best_mean", n ? fastestSum / n : 0.0},
                         {"fastest_over_best_worst", fastestWorst},
                         {"largest_over_best_mean", n ? largestSum / n : 0.0},
                         {"largest_over_best_worst", largestWorst},
                         {"cost_share_of_100_steps_mean", n ? costSum / n : 0.0},
                         {"cost_share_of_100_steps_worst", costWorst},
                         {"sweep_noise_median", noises.empty() ? 0.0 : bench::median(noises)}};
    report["seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
    bench::writeJson(args.outDir, "fastest.json", report);
    bench::writeCsv(args.outDir, "fastest.csv",
                    "setup,target_batch,largest_fit,best_size,best_samples_per_s,chosen,chosen_over_best,"
                    "largest_over_best,micro_batches_timed,cost_s,cost_pct_of_100_steps",
                    rows);
    if (n == 0) {
        std::printf("no setup measured; %.0f s\n", report["seconds"].get<double>());
        return 0;
    }
    std::printf(
        "fastest: %.3f of the best on average (worst %.3f); largest: %.3f (worst %.3f); search cost "
        "%.2f%% of a 100-step run on average (worst %.2f%%); %.0f s\n",
        report["summary"]["fastest_over_best_mean"].get<double>(), fastestWorst,
        report["summary"]["largest_over_best_mean"].get<double>(), largestWorst, 100.0 * costSum / std::max(n, 1),
        100.0 * costWorst, report["seconds"].get<double>());
    return 0;
}

}  // namespace bench_fastest

BATCHPILOT_BENCH_MAIN("batchpilot-bench-fastest", bench_fastest::run)
