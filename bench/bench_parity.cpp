// batchpilot-bench-parity: BatchPilot against a plain training loop (yardstick/plain_loop.h) on the
// same virtual GPU. For each model and optimizer: the plain loop's largest micro-batch, BatchPilot's
// probe with the default headroom and with none, their ratio; the fixed memory of each (parameters,
// gradients, optimizer state) and the probe's fitted memory model; and samples/s of each at the
// same micro-batch, measured in turns (plain, BatchPilot, plain, ...), their ratio per turn.
// Writes parity.json and parity.csv.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include <ATen/Context.h>
#include <torch/version.h>

#include "bench/bench_util.h"
#include "core/device/counting_allocator.h"
#include "core/train/trainer.h"
#include "yardstick/plain_loop.h"
#include "bench/bench_main.h"

namespace bench_parity {

namespace {

using namespace batchpilot;
using Clock = std::chrono::steady_clock;
constexpr int64_t kMiB = 1024 * 1024;

struct Case {
    std::string label;
    yardstick::PlainLoopSetup loop;
    int64_t upper = 0;  ///< the largest micro-batch searched (the target batch)
    /// Samples each speed run trains after its first step: enough for about a second of training,
    /// so that timer and scheduling noise stay small against it.
    int64_t speedSamples = 0;
};

Case make(const std::string& label, const std::string& model, int64_t width, int64_t side, core::OptimizerKind kind,
          int64_t budgetMiB, int64_t upper, int64_t speedSamples) {
    Case c;
    c.speedSamples = speedSamples;
    c.label = label;
    c.loop.model.name = model;
    c.loop.model.width = width;
    c.loop.data.channels = 3;
    c.loop.data.height = side;
    c.loop.data.width = side;
    c.loop.optimizer.kind = kind;
    c.loop.optimizer.learningRate = kind == core::OptimizerKind::Sgd ? 0.05 : 0.001;
    c.loop.budgetBytes = budgetMiB * kMiB;
    c.upper = upper;
    return c;
}

std::vector<Case> cases(bool quick, const std::string& torchscript, const std::string& transformer) {
    using core::OptimizerKind;
    std::vector<Case> all = {
        make("mlp 3x32x32, SGD", "mlp", 16, 32, OptimizerKind::Sgd, 10, 2048, 32768),
        make("mlp 3x32x32, Adam", "mlp", 16, 32, OptimizerKind::Adam, 10, 2048, 32768),
        make("mlp width 128, Adam", "mlp", 128, 32, OptimizerKind::Adam, 96, 4096, 16384),
        make("cnn 3x32x32, SGD", "cnn", 32, 32, OptimizerKind::Sgd, 56, 2048, 8192),
        make("cnn 3x32x32, AdamW", "cnn", 32, 32, OptimizerKind::AdamW, 56, 2048, 8192),
        make("resnet 3x64x64, SGD", "resnet", 16, 64, OptimizerKind::Sgd, 96, 512, 1024),
        make("resnet 3x64x64, Adam", "resnet", 16, 64, OptimizerKind::Adam, 96, 512, 1024),
        make("resnet 3x224x224, SGD", "resnet", 16, 224, OptimizerKind::Sgd, 320, 256, 128),
    };
    if (!torchscript.empty())
        all.push_back(make("TorchScript SmallNet, SGD", torchscript, 32, 32, OptimizerKind::Sgd, 24, 2048, 4096));
    if (!transformer.empty())
        all.push_back(make("TorchScript transformer, Adam", transformer, 32, 32, OptimizerKind::Adam, 96, 512, 512));
    if (quick) all = {all[1], all[3], all[5]};
    return all;
}

core::TrainerOptions trainerOptions(const Case& c, int64_t targetBatch, int steps, double headroom) {
    core::TrainerOptions o;
    o.model = c.loop.model;
    o.data = c.loop.data;
    o.data.samples = targetBatch;
    o.device = c.loop.deviceName();
    o.optimizer = c.loop.optimizer;
    o.targetBatch = targetBatch;
    o.steps = steps;
    o.seed = 1;
    o.probe.headroom = headroom;
    o.probe.objective = core::ProbeObjective::Largest;
    o.validation.split = 0;
    return o;
}

/// Keeps what the benchmark reads of a run.
class Sink final : public core::EventSink {
public:
    void onEvent(const core::Event& event) override {
        if (const auto* f = std::get_if<core::ProbeFinished>(&event); f && !probe) probe = *f;
        if (const auto* b = std::get_if<core::MemoryBreakdown>(&event)) breakdown = *b;
        if (const auto* m = std::get_if<core::StepMetrics>(&event)) steps.push_back(*m);
        if (std::holds_alternative<core::OomEvent>(event) && probe) ++oomsAfterProbe;
    }
    std::optional<core::ProbeFinished> probe;
    std::optional<core::MemoryBreakdown> breakdown;
    std::vector<core::StepMetrics> steps;
    int oomsAfterProbe = 0;
};

struct Probe {
    int64_t found = 0;
    double fittedFixedBytes = 0;
    int64_t fixedBytes = 0;  ///< parameters + gradients + optimizer state, from the breakdown
    int oomsAfterProbe = 0;
    std::string error;
};

Probe probe(const Case& c, double headroom) {
    Sink sink;
    core::Trainer trainer(trainerOptions(c, 2 * c.upper, 3, headroom), sink);
    const core::RunResult result = trainer.run();
    Probe p;
    p.error = result.error;
    if (sink.probe) {
        p.found = sink.probe->microBatch;
        p.fittedFixedBytes = sink.probe->fixedBytes;
    }
    if (sink.breakdown) {
        p.fixedBytes =
            sink.breakdown->parameterBytes + sink.breakdown->gradientBytes + sink.breakdown->optimizerStateBytes;
    }
    p.oomsAfterProbe = sink.oomsAfterProbe;
    return p;
}

/// BatchPilot at a fixed micro-batch: samples/s over the steps after the first.
double batchPilotSpeed(const Case& c, int64_t micro, int64_t target, int steps) {
    core::TrainerOptions o = trainerOptions(c, target, steps, 0);
    o.probe.initialMicroBatch = micro;
    o.probe.maxMicroBatch = micro;
    Sink sink;
    core::Trainer trainer(o, sink);
    trainer.run();
    double samples = 0, seconds = 0;
    for (const auto& s : sink.steps) {
        if (s.step == 1) continue;
        samples += static_cast<double>(target);
        seconds += s.stepSeconds;
    }
    return seconds > 0 ? samples / seconds : 0;
}

}  // namespace

int run(int argc, char** argv) {
    std::string torchscript, transformer;
    std::vector<char*> rest{argv[0]};
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--torchscript") == 0 && i + 1 < argc)
            torchscript = argv[++i];
        else if (std::strcmp(argv[i], "--transformer") == 0 && i + 1 < argc)
            transformer = argv[++i];
        else
            rest.push_back(argv[i]);
    }
    const auto args = bench::parseArgs(static_cast<int>(rest.size()), rest.data(), "batchpilot-bench-parity",
                                       "BatchPilot against a plain training loop; --torchscript SMALLNET.pt and "
                                       "--transformer MODEL.pt add TorchScript models.");
    core::installCountingAllocator();
    // oneDNN's convolutions hold extra memory that depends on what ran before in the process (a
    // TorchScript ResNet: 106 MiB at micro-batch 16 in a process's first run, 142 MiB in later
    // ones, either loop): both loops run without it, so that the table compares their own memory.
    at::globalContext().setUserEnabledMkldnn(false);
    const auto started = Clock::now();
    nlohmann::json report;
    report["bench"] = "parity";
    report["torch_version"] = TORCH_VERSION;
    report["machine"] = bench::machineDescription();
    std::vector<std::string> rows;
    // Six turns in alternating order (plain first, then BatchPilot first): a process that warms
    // up or a machine that drifts during a turn favours neither loop.
    const int turns = args.quick ? 2 : 6;
    for (const Case& c : cases(args.quick, torchscript, transformer)) {
        const auto caseStarted = Clock::now();
        const int64_t plain = yardstick::plainLoopLargest(c.loop, c.upper);
        const Probe byDefault = probe(c, core::ProbeOptions{}.headroom);
        const Probe noHeadroom = probe(c, 0);
        // Speed at one size both fit, in turns: a drift of the machine hits both alike.
        const int64_t micro = std::max<int64_t>(1, std::min(plain, noHeadroom.found));
        const int64_t target = 4 * micro;
        const int steps = 1 + static_cast<int>(std::clamp<int64_t>((c.speedSamples + target - 1) / target, 2, 64));
        std::vector<double> plainSpeeds, ownSpeeds, ratios;
        int64_t plainFixed = 0;
        for (int turn = 0; turn < turns; ++turn) {
            double own = 0;
            if (turn % 2 == 1) own = batchPilotSpeed(c, micro, target, steps);
            const yardstick::PlainLoopRun run = yardstick::runPlainLoop(c.loop, micro, target, steps);
            plainFixed = run.fixedBytes;
            if (turn % 2 == 0) own = batchPilotSpeed(c, micro, target, steps);
            plainSpeeds.push_back(run.samplesPerSecond);
            ownSpeeds.push_back(own);
            ratios.push_back(run.samplesPerSecond > 0 ? own / run.samplesPerSecond : 0);
        }
        const double found = plain > 0 ? static_cast<double>(noHeadroom.found) / static_cast<double>(plain) : 0;
        nlohmann::json config = {{"setup", c.label},
                                 {"model", c.loop.model.name},
                                 {"budget_bytes", c.loop.budgetBytes},
                                 {"plain_largest", plain},
                                 {"batchpilot_default", byDefault.found},
                                 {"batchpilot_headroom0", noHeadroom.found},
                                 {"headroom0_over_plain", found},
                                 {"default_over_plain", plain > 0 ? double(byDefault.found) / double(plain) : 0.0},
                                 {"ooms_after_probe", noHeadroom.oomsAfterProbe + byDefault.oomsAfterProbe},
                                 {"plain_fixed_bytes", plainFixed},
                                 {"batchpilot_fixed_bytes", noHeadroom.fixedBytes},
                                 {"batchpilot_fitted_fixed_bytes", noHeadroom.fittedFixedBytes},
                                 {"speed_micro_batch", micro},
                                 {"plain_samples_per_s", bench::median(plainSpeeds)},
                                 {"batchpilot_samples_per_s", bench::median(ownSpeeds)},
                                 {"speed_ratio", bench::median(ratios)},
                                 {"speed_ratio_min", *std::min_element(ratios.begin(), ratios.end())},
                                 {"speed_ratio_max", *std::max_element(ratios.begin(), ratios.end())},
                                 {"speed_turns", turns},
                                 {"error", noHeadroom.error + byDefault.error},
                                 {"seconds", std::chrono::duration<double>(Clock::now() - caseStarted).count()}};
        rows.push_back("\"" + c.label + "\"," + std::to_string(c.loop.budgetBytes / kMiB) + "," +
                       std::to_string(plain) + "," + std::to_string(byDefault.found) + "," +
                       std::to_string(noHeadroom.found) + "," + bench::fixed(found, 3) + "," +
                       std::to_string(plainFixed) + "," + std::to_string(noHeadroom.fixedBytes) + "," +
                       bench::fixed(noHeadroom.fittedFixedBytes, 0) + "," + std::to_string(micro) + "," +
                       bench::fixed(bench::median(ratios), 3));
        report["configs"].push_back(config);
        std::printf(
            "%-30s plain %5lld  BatchPilot %5lld (headroom 0: %5lld, %.3f)  fixed %.2f / %.2f MiB  speed %.3f\n",
            c.label.c_str(), static_cast<long long>(plain), static_cast<long long>(byDefault.found),
            static_cast<long long>(noHeadroom.found), found, static_cast<double>(plainFixed) / kMiB,
            static_cast<double>(noHeadroom.fixedBytes) / kMiB, bench::median(ratios));
        std::fflush(stdout);
    }
    report["seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
    bench::writeJson(args.outDir, "parity.json", report);
    bench::writeCsv(args.outDir, "parity.csv",
                    "setup,budget_mib,plain_largest,batchpilot_default,batchpilot_headroom0,headroom0_over_plain,"
                    "plain_fixed_bytes,batchpilot_fixed_bytes,batchpilot_fitted_fixed_bytes,speed_micro_batch,"
                    "speed_ratio",
                    rows);
    std::printf("parity benchmark: %.1f s\n", report["seconds"].get<double>());
    return 0;
}

}  // namespace bench_parity

BATCHPILOT_BENCH_MAIN("batchpilot-bench-parity", bench_parity::run)
