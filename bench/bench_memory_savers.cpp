// batchpilot-bench-memory-savers: what each memory saver (issue 15) buys and costs on a model.
// For each setup and each saver (off, checkpoint, bf16, both; a TorchScript model: off, bf16),
// one run with the objective "largest" on the setup's virtual budget: the probe's micro-batch,
// its fitted bytes per sample and fixed bytes, and the samples/s of the steps after the probe.
// Then a budget on which nothing fits at micro-batch 1 without a saver (2% below the peak of one
// sample, measured): every saver alone, and "auto", whose choice is scored against
// the fastest saver measured there. And the survey (core/plan/saver_survey.h): one run that measures
// every saver after its probe, whose predicted micro-batches and samples/s are compared with the
// runs above, and whose suggestion is scored against the fastest saver they measured. Last, the
// issue's own case (images of 1024×1024 on 256 MiB) with auto. Writes memory_savers.json and
// memory_savers.csv.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include <torch/version.h>

#include "bench/bench_util.h"
#include "bench/trainer_workload.h"
#include "core/device/counting_allocator.h"
#include "core/config/memory_savers.h"
#include "bench/bench_main.h"

namespace bench_memory_savers {

namespace {

using namespace batchpilot;
using Clock = std::chrono::steady_clock;

struct Setup {
    std::string label;
    core::TrainerOptions options;
    bool canCheckpoint = true;
};

std::vector<Setup> setups(bool quick, const std::string& torchscript) {
    std::vector<Setup> out;
    core::TrainerOptions base;
    base.data.samples = 512;
    base.targetBatch = 32;
    base.steps = quick ? 2 : 5;
    base.seed = 1;
    base.optimizer.learningRate = 0.01;
    base.probe.objective = core::ProbeObjective::Largest;
    base.validation.split = 0;
    {
        core::TrainerOptions o = base;
        o.model.name = "resnet";
        o.model.width = 16;
        o.data.height = o.data.width = 224;
        o.device = "virtual:256MiB/exact";
        out.push_back({"resnet (width 16) 3x224x224, 256 MiB", o, true});
    }
    {
        core::TrainerOptions o = base;
        o.model.name = "resnet";
        o.model.width = 16;
        o.data.height = o.data.width = 64;
        o.device = "virtual:24MiB/exact";
        out.push_back({"resnet (width 16) 3x64x64, 24 MiB", o, true});
    }
    if (!torchscript.empty()) {
        core::TrainerOptions o = base;
        o.model.name = torchscript;
        o.data.height = o.data.width = 32;
        o.targetBatch = 256;
        o.device = "virtual:64MiB/exact";
        out.push_back({"TorchScript SmallNet 3x32x32, 64 MiB", o, false});
    }
    return out;
}

struct Measured {
    bool fits = false;
    std::string error;
    int64_t microBatch = 0;
    int64_t accumulationSteps = 0;
    double bytesPerSample = 0;
    double fixedBytes = 0;
    double samplesPerSecond = 0;
    std::string autoChose;  ///< auto only: the savers it turned on ("off": none)
};

Measured measure(core::TrainerOptions o) {
    Measured m;
    bench::RecordedRun run;
    try {
        run = bench::runEvents(o);
    } catch (const std::exception& e) {
        m.error = e.what();
        return m;
    }
    m.fits = true;
    std::optional<core::ProbeFinished> probe;
    m.autoChose = o.memorySavers == core::MemorySavers::Auto ? "off" : "";
    for (const core::Event& e : run.events) {
        if (const auto* p = std::get_if<core::ProbeFinished>(&e)) probe = *p;  // the last: after any saver
        if (const auto* b = std::get_if<core::MemoryBreakdown>(&e); b && !m.autoChose.empty())
            m.autoChose = b->memorySavers.empty() ? "off" : b->memorySavers;
    }
    if (probe) {
        m.microBatch = probe->microBatch;
        m.bytesPerSample = static_cast<double>(probe->bytesPerSample);
        m.fixedBytes = static_cast<double>(probe->fixedBytes);
    }
    const bench::Throughput t = bench::throughputOf(run.events, run.result.microBatch);
    m.samplesPerSecond = t.samplesPerSecond;
    m.accumulationSteps = t.accumulationSteps;
    return m;
}

/// A run without savers whose first probe is followed by the survey (a threshold above any
/// micro-batch), on the setup's budget.
std::optional<core::SaverSurvey> surveyOf(core::TrainerOptions o) {
    o.memorySavers = core::MemorySavers::Off;
    o.saverThreshold = core::kMaxTargetBatch;
    o.steps = 4;  // the survey runs at the batch after the probe ended (a probe can take two)
    try {
        for (const core::Event& e : bench::runEvents(o).events)
            if (const auto* s = std::get_if<core::SaverSurvey>(&e)) return *s;
    } catch (const std::exception&) {
        return std::nullopt;
    }
    return std::nullopt;
}

/// The measured peak of one sample (a micro-batch of 1) on a budget it fits in, without savers.
int64_t peakAtOne(core::TrainerOptions o) {
    o.device = "virtual:4GiB/exact";
    o.memorySavers = core::MemorySavers::Off;
    o.probe.initialMicroBatch = o.probe.maxMicroBatch = 1;
    o.targetBatch = 1;
    o.steps = 1;
    int64_t peak = 0;
    for (const core::Event& e : bench::runEvents(o).events)
        if (const auto* b = std::get_if<core::MemoryBreakdown>(&e); b && b->activationMicroBatch == 1)
            peak = b->peakBytes;
    return peak;
}

/// The case issue 15 was written for: the ResNet (width 32) on images of 1024×1024 on a 256 MiB
/// budget, where one sample needs more than the budget without a saver. A run with `auto`: its
/// probe fails, the survey measures every saver, auto applies the fastest that fits, a probe
/// finds its micro-batch. The survey's prediction against that probe, and the samples/s trained.
nlohmann::json largeImages() {
    core::TrainerOptions o;
    o.model.name = "resnet";
    o.data.height = o.data.width = 1024;
    o.data.samples = 64;
    o.device = "virtual:256MiB/exact";
    o.targetBatch = 16;
    o.steps = 2;  // samples/s over the second (the first holds the probes and the survey)
    o.seed = 1;
    o.probe.objective = core::ProbeObjective::Largest;
    o.validation.split = 0;
    o.memorySavers = core::MemorySavers::Auto;
    nlohmann::json j = {{"label", "resnet (width 32) 3x1024x1024, 256 MiB, target batch 16, auto"}};
    const auto started = Clock::now();
    bench::RecordedRun run;
    try {
        run = bench::runEvents(o);
    } catch (const std::exception& e) {
        j["error"] = e.what();
        return j;
    }
    j["seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
    std::optional<core::SaverSurvey> survey;
    std::optional<core::ProbeFinished> probe;
    for (const core::Event& e : run.events) {
        if (const auto* s = std::get_if<core::SaverSurvey>(&e)) survey = *s;
        if (const auto* p = std::get_if<core::ProbeFinished>(&e)) probe = *p;
        if (const auto* b = std::get_if<core::MemoryBreakdown>(&e)) j["savers"] = b->memorySavers;
        if (const auto* m = std::get_if<core::StepMetrics>(&e)) j["peak_bytes"] = m->peakBytes;
    }
    j["trained"] = run.result.state == core::RunState::Finished;
    if (survey) {
        j["survey_seconds"] = survey->seconds;
        for (const core::SaverOption& option : survey->options) {
            nlohmann::json r = {{"savers", option.savers}, {"fits", option.fits}};
            if (option.fits) r["predicted_micro_batch"] = option.microBatch;
            j["survey"].push_back(r);
            if (option.fits && option.savers == j.value("savers", std::string())) {
                j["predicted_micro_batch"] = option.microBatch;
            }
        }
    }
    if (probe) j["probed_micro_batch"] = probe->microBatch;
    const bench::Throughput t = bench::throughputOf(run.events, run.result.microBatch);
    j["samples_per_s"] = t.samplesPerSecond;
    std::printf("%s: %s with %s, predicted micro-batch %lld, probed %lld, %.2f samples/s (%.0f s)\n",
                j["label"].get<std::string>().c_str(), j["trained"].get<bool>() ? "trained" : "did not train",
                j.value("savers", std::string("?")).c_str(),
                static_cast<long long>(j.value("predicted_micro_batch", int64_t{0})),
                static_cast<long long>(j.value("probed_micro_batch", int64_t{0})), t.samplesPerSecond,
                j["seconds"].get<double>());
    std::fflush(stdout);
    return j;
}

nlohmann::json toJson(const std::string& savers, const Measured& m) {
    nlohmann::json j = {{"savers", savers}, {"fits", m.fits}};
    if (!m.fits) {
        j["error"] = m.error;
        return j;
    }
    j["micro_batch"] = m.microBatch;
    j["accumulation_steps"] = m.accumulationSteps;
    j["bytes_per_sample"] = m.bytesPerSample;
    j["fixed_bytes"] = m.fixedBytes;
    j["samples_per_s"] = m.samplesPerSecond;
    if (!m.autoChose.empty()) j["auto_chose"] = m.autoChose;
    return j;
}

}  // namespace

int run(int argc, char** argv) {
    std::string torchscript;
    std::vector<char*> rest{argv[0]};
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--torchscript") == 0 && i + 1 < argc)
            torchscript = argv[++i];
        else
            rest.push_back(argv[i]);
    }
    const auto args = bench::parseArgs(static_cast<int>(rest.size()), rest.data(), "batchpilot-bench-memory-savers",
                                       "Memory per sample and samples/s for each memory saver, and how auto's "
                                       "choice compares with the best (also takes --torchscript MODEL.pt).");
    core::installCountingAllocator();
    const auto started = Clock::now();
    nlohmann::json report;
    report["bench"] = "memory_savers";
    report["torch_version"] = TORCH_VERSION;
    report["machine"] = bench::machineDescription();
    std::vector<std::string> rows;
    for (const Setup& setup : setups(args.quick, torchscript)) {
        std::vector<core::MemorySavers> savers{core::MemorySavers::Off, core::MemorySavers::Bf16};
        if (setup.canCheckpoint)
            savers = {core::MemorySavers::Off, core::MemorySavers::Checkpoint, core::MemorySavers::Bf16,
                      core::MemorySavers::Both};
        nlohmann::json entry = {{"label", setup.label},
                                {"model", setup.options.model.name},
                                {"device", setup.options.device},
                                {"target_batch", setup.options.targetBatch}};
        const int64_t plainPeakAtOne = peakAtOne(setup.options);
        entry["peak_at_one_bytes"] = plainPeakAtOne;
        for (const core::MemorySavers s : savers) {
            core::TrainerOptions o = setup.options;
            o.memorySavers = s;
            const Measured m = measure(o);
            entry["on_budget"].push_back(toJson(core::toString(s), m));
            rows.push_back("\"" + setup.label + "\",budget," + core::toString(s) + "," + std::to_string(m.microBatch) +
                           "," + bench::fixed(m.bytesPerSample, 0) + "," + bench::fixed(m.samplesPerSecond, 2));
            std::printf("%s, %s: micro-batch %lld, %.0f bytes/sample, %.2f samples/s%s\n", setup.label.c_str(),
                        core::toString(s), static_cast<long long>(m.microBatch), m.bytesPerSample, m.samplesPerSecond,
                        m.fits ? "" : (" — " + m.error).c_str());
            std::fflush(stdout);
        }
        if (const std::optional<core::SaverSurvey> survey = surveyOf(setup.options)) {
            // Predicted against measured, saver by saver; the suggestion against the fastest.
            nlohmann::json rowsJson = nlohmann::json::array();
            double best = 0;
            double suggested = 0;
            const std::string pick = survey->suggestion.empty() ? survey->current : survey->suggestion;
            for (const core::SaverOption& option : survey->options) {
                nlohmann::json r = {{"savers", option.savers}, {"fits", option.fits}};
                for (const nlohmann::json& measured : entry["on_budget"]) {
                    if (measured["savers"] != option.savers || !measured["fits"].get<bool>()) continue;
                    const double rate = measured["samples_per_s"].get<double>();
                    best = std::max(best, rate);
                    if (option.savers == pick) suggested = rate;
                    r["measured_micro_batch"] = measured["micro_batch"];
                    r["measured_samples_per_s"] = rate;
                }
                if (option.fits) {
                    r["predicted_micro_batch"] = option.microBatch;
                    r["predicted_samples_per_s"] = option.samplesPerSecond;
                    r["trials"] = option.trials;
                }
                if (!option.unavailable.empty()) r["unavailable"] = option.unavailable;
                std::printf("  survey, %s: predicted micro-batch %lld at %.2f samples/s%s\n", option.savers.c_str(),
                            static_cast<long long>(option.microBatch), option.samplesPerSecond,
                            r.contains("measured_micro_batch")
                                ? (", measured " + std::to_string(r["measured_micro_batch"].get<int64_t>())).c_str()
                                : "");
                rowsJson.push_back(r);
            }
            entry["survey"] = {{"seconds", survey->seconds},
                               {"suggestion", survey->suggestion},
                               {"advice", survey->advice},
                               {"options", rowsJson},
                               {"suggestion_over_best", best > 0 ? suggested / best : 0.0}};
            std::fflush(stdout);
        }
        if (plainPeakAtOne > 0) {
            // Just below what one sample needs without savers: nothing fits without one.
            const auto tight =
                static_cast<int64_t>(static_cast<double>(plainPeakAtOne) * 0.98 / (1.0 - setup.options.probe.headroom));
            entry["tight_budget_bytes"] = tight;
            double best = 0;
            std::string bestSavers;
            std::vector<core::MemorySavers> candidates = savers;
            candidates.push_back(core::MemorySavers::Auto);
            Measured chosen;
            for (const core::MemorySavers s : candidates) {
                core::TrainerOptions o = setup.options;
                o.device = "virtual:" + std::to_string(tight) + "B/exact";
                o.memorySavers = s;
                const Measured m = measure(o);
                entry["tight"].push_back(toJson(core::toString(s), m));
                rows.push_back("\"" + setup.label + "\",tight," + core::toString(s) + "," +
                               std::to_string(m.microBatch) + "," + bench::fixed(m.bytesPerSample, 0) + "," +
                               bench::fixed(m.samplesPerSecond, 2));
                std::printf(
                    "  tight budget %.1f MiB, %s: %s\n", static_cast<double>(tight) / (1 << 20), core::toString(s),
                    m.fits
                        ? ("micro-batch " + std::to_string(m.microBatch) + ", " + bench::fixed(m.samplesPerSecond, 2) +
                           " samples/s" + (m.autoChose.empty() ? "" : ", auto chose " + m.autoChose))
                              .c_str()
                        : "does not fit");
                std::fflush(stdout);
                if (s == core::MemorySavers::Auto) {
                    chosen = m;
                } else if (m.fits && m.samplesPerSecond > best) {
                    best = m.samplesPerSecond;
                    bestSavers = core::toString(s);
                }
            }
            if (!bestSavers.empty()) {
                entry["best_on_tight"] = bestSavers;
                entry["auto_over_best"] = chosen.fits ? chosen.samplesPerSecond / best : 0.0;
            }
        }
        report["setups"].push_back(entry);
    }
    if (!args.quick) report["large_images"] = largeImages();
    report["seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
    bench::writeJson(args.outDir, "memory_savers.json", report);
    bench::writeCsv(args.outDir, "memory_savers.csv", "setup,budget,savers,micro_batch,bytes_per_sample,samples_per_s",
                    rows);
    std::printf("memory savers: %.1f s\n", report["seconds"].get<double>());
    return 0;
}

}  // namespace bench_memory_savers

BATCHPILOT_BENCH_MAIN("batchpilot-bench-memory-savers", bench_memory_savers::run)
