#pragma once

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <QtGlobal>

#include "core/device/counting_allocator.h"
#include "core/nn/model.h"
#include "core/train/trainer.h"
#include "recording_sink.h"
#include "yardstick/plain_loop.h"

namespace batchpilot::tests {

/// A run without faults, for fault-injection tests: its final weights, and the numbers of the
/// counted allocations (from the first probe on, so set-up, where an OOM is fatal by design, is
/// never a target) that fall inside micro-batches (copy, forward, backward) and inside optimizer
/// steps. CountingAllocator::failAfter(n) armed at the first probe hits allocation n.
struct CleanRun {
    std::vector<int64_t> microBatchAllocations;
    std::vector<int64_t> optimizerAllocations;
    /// The first counted allocation of each micro-batch: the copy of its inputs to the device.
    std::vector<int64_t> firstOfMicroBatch;
    std::vector<torch::Tensor> weights;
};

/// How many distinct injected OOMs the fault-injection tests need in each phase: 20, or
/// BATCHPILOT_FAULTS_PER_PHASE where a sanitizer build sets it lower (tests/core/CMakeLists.txt:
/// under ASan each injected run of a ResNet takes seconds, and the recovery code is the same).
inline int faultsPerPhase() {
    bool ok = false;
    const int n = qEnvironmentVariableIntValue("BATCHPILOT_FAULTS_PER_PHASE", &ok);
    return ok && n > 0 ? n : 20;
}

/// The largest absolute difference between two runs' weights, tensor by tensor (1e30 when they
/// hold different numbers of tensors).
inline double largestDifference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    double worst = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
        worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
    return a.size() == b.size() ? worst : 1e30;
}

inline std::vector<torch::Tensor> finalWeights(core::Trainer& trainer) {
    std::vector<torch::Tensor> out;
    for (const auto& p : trainer.model()->parameters()) out.push_back(p.detach().clone());
    return out;
}

/// Makes counted allocation `failAt` fail as an OOM, counted from the run's first probe (set-up,
/// where an OOM is fatal by design, is never a target): the numbering CleanRun's allocations use.
/// Takes `sink`'s onEach.
inline void failAtFromFirstProbe(RecordingSink& sink, int64_t failAt) {
    sink.onEach = [armed = false, failAt](const core::Event& e) mutable {
        if (const auto* s = std::get_if<core::RunStateChanged>(&e);
            s && s->state == core::RunState::Probing && !armed) {
            armed = true;
            core::CountingAllocator::instance().failAfter(failAt);
        }
    };
}

/// Runs `options` twice and measures the second: LibTorch allocates some things once per process
/// (kernel caches, lazy initialisation), so the measured run allocates exactly as later ones do.
/// Throws when the run fails or runs out of memory.
inline CleanRun measureCleanRun(const core::TrainerOptions& options) {
    using namespace core;
    {
        RecordingSink warmSink;
        Trainer warm(options, warmSink);
        warm.run();
    }
    auto& allocator = CountingAllocator::instance();
    CleanRun run;
    RecordingSink sink;
    int64_t start = -1;
    int64_t last = 0;
    sink.onEach = [&](const Event& e) {
        const int64_t now = allocator.countedAllocations();
        if (const auto* s = std::get_if<RunStateChanged>(&e); s && s->state == RunState::Probing && start < 0) {
            start = now;
        } else if (start >= 0 && std::holds_alternative<MicroBatchDone>(e)) {
            if (now - start > last) run.firstOfMicroBatch.push_back(last + 1);
            for (int64_t n = last + 1; n <= now - start; ++n) run.microBatchAllocations.push_back(n);
            last = now - start;
        } else if (start >= 0 && std::holds_alternative<OptimizerStepped>(e)) {
            for (int64_t n = last + 1; n <= now - start; ++n) run.optimizerAllocations.push_back(n);
            last = now - start;
        } else if (start >= 0 && std::holds_alternative<ValidationDone>(e)) {
            last = now - start;  // a validation pass: neither a micro-batch nor an optimizer step
        }
    };
    Trainer trainer(options, sink);
    const RunResult result = trainer.run();
    if (result.state != RunState::Finished || !sink.all<OomEvent>().empty()) {
        throw std::runtime_error("the clean run failed: " + result.error);
    }
    run.weights = finalWeights(trainer);
    return run;
}

/// The memory breakdown of one undisturbed step of `options` at micro-batch `n` (the probe pinned
/// to it) on a 4 GiB virtual GPU: how a test sizes a budget from what this machine's LibTorch
/// allocates. Aborts the test when the run fails.
inline core::MemoryBreakdown breakdownAt(core::TrainerOptions options, int64_t n) {
    options.device = "virtual:4GiB";
    options.probe.initialMicroBatch = options.probe.maxMicroBatch = n;
    options.steps = 1;
    RecordingSink sink;
    core::Trainer trainer(options, sink);
    if (trainer.run().state != core::RunState::Finished) qFatal("the measuring run failed");
    const auto memory = sink.all<core::MemoryBreakdown>();
    if (memory.empty()) qFatal("the measuring run reported no memory breakdown");
    return memory.back();
}

/// The plain training loop (yardstick/plain_loop.h) with the model, data, loss and optimizer of
/// `options`, on the host without a budget.
inline yardstick::PlainLoopSetup plainSetup(const core::TrainerOptions& options) {
    yardstick::PlainLoopSetup setup;
    setup.model = options.model;
    setup.data = options.data;
    setup.loss = options.loss;
    setup.optimizer = options.optimizer;
    setup.device = "cpu";
    return setup;
}

/// The weights a plain training loop ends with when it trains exactly the micro-batches a run of
/// `options` committed (`sink`: with TrainerOptions::reportSampleIndices), batch by batch, from the
/// same seed: an independent reference for the run's own weights, whatever split an OOM forced.
inline std::vector<torch::Tensor> plainLoopWeights(const core::TrainerOptions& options, const RecordingSink& sink) {
    std::map<int64_t, yardstick::PlainBatch> byStep;
    for (const core::MicroBatchDone& m : sink.committedMicroBatches()) {
        if (m.sampleIndices.size() != static_cast<size_t>(m.size))
            throw std::runtime_error("the run did not report its sample indices (reportSampleIndices)");
        byStep[m.step].push_back(m.sampleIndices);
    }
    std::vector<yardstick::PlainBatch> batches;
    for (auto& [step, batch] : byStep) batches.push_back(std::move(batch));
    return yardstick::replayPlainLoop(plainSetup(options), batches, options.seed);
}

/// How far a run's weights may end from the plain loop's on the same micro-batches. The same
/// operations on the same floats in the same order round the same way: measured 0 with LibTorch
/// 1.13 (GCC) and 2.x (GCC, and Clang with the sanitizers), after recovered OOMs in every phase.
/// A fixed ceiling, not calibrated from other runs: a recovery that lost, repeated or reordered a
/// sample, or left a part of a gradient behind, moves the weights by far more.
inline constexpr double kPlainLoopBound = 1e-7;

}  // namespace batchpilot::tests
