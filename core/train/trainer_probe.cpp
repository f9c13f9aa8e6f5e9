// The trainer's probe sessions (start, finish: core/plan/probe_search.h decides the sizes) and the
// device switch that ends in a new probe.

#include "core/base/text_format.h"
#include "core/train/trainer_impl.h"

namespace batchpilot::core {

void Trainer::Impl::startProbe(ProbeReason reason, int64_t initial, int64_t knownFit) {
    timing.reset();  // a new probe ends a timing in progress; it times again when it finishes
    drift.reset();
    ProbeOptions probeOptions = options.probe;
    probeOptions.initialMicroBatch = std::max<int64_t>(sizes.minMicroBatch, std::min(initial, upperBound()));
    probe.emplace(probeOptions, upperBound(), usableBytes(), std::min(knownFit, upperBound()));
    trialRepeat.reset();
    currentProbeReason = reason;
    ++probeSequence;
    probeStart = Clock::now();
    if (!optimizer->stateReady() && reservation.empty() && optimizer->stateBytes() > 0) {
        // LibTorch-style optimizers create their state in the first step: hold that much now so
        // the probe does not pick a size that runs out of memory at the first step.
        try {
            reservation = optimizer->reserveState();
        } catch (const std::exception&) {
            const FailureInfo failure = classifyFailure(std::current_exception());
            if (!failure.outOfMemory) throw;
            doesNotFit(failure.requestedBytes, /*duringSetup=*/false, /*suggestSavers=*/false);
        }
    }
    setState(RunState::Probing, toString(reason));
    emit(ProbeStarted{now(), probeSequence, reason, device.name(), upperBound(), usableBytes(),
                      reservation.empty() ? 0 : optimizer->stateBytes()});
}

void Trainer::Impl::finishProbe() {
    const int64_t found = probe->result();
    if (found <= 0) {
        // Out of trials before it got down to the smallest size: that says nothing of whether
        // the model fits ("not even at micro-batch 1" would be untrue).
        int64_t smallest = std::numeric_limits<int64_t>::max();
        for (const TrialOutcome& trial : probe->history()) smallest = std::min(smallest, trial.size);
        if (probe->hitTrialLimit() && smallest > sizes.minMicroBatch) {
            throw FatalError{"the probe used up its " + std::to_string(options.probe.maxTrials) +
                                 " trial(s) (--max-trials) before any micro-batch fit: the smallest it tried was " +
                                 std::to_string(smallest) +
                                 "; allow more trials, or start lower with --initial-micro-batch",
                             "configuration"};
        }
        if (nextMemorySavers(0)) return;  // probes again, with memory savers
        doesNotFit(0);
    }
    sizes.probeFound(found);
    // A small micro-batch where a larger one would help: every saver is measured at the next
    // training batch (applyCommands), and the fastest suggested. Not after a probe that a saver
    // change itself started, nor after a regrow or a re-probe of the same setting.
    const bool newSetting = currentProbeReason == ProbeReason::Initial ||
                            currentProbeReason == ProbeReason::DeviceSwitch ||
                            currentProbeReason == ProbeReason::TargetBatchChange;
    if (newSetting && !parallel && found < options.saverThreshold && found < upperBound()) {
        surveyDue = "the probe found micro-batch " + std::to_string(found) + ", below " +
                    std::to_string(options.saverThreshold) + " (the saver threshold)";
    }
    ProbeFinished done{now(),
                       probeSequence,
                       found,
                       static_cast<int64_t>(planFor(localTarget(), found).size()),
                       localTarget(),
                       probe->trials(),
                       std::chrono::duration<double>(Clock::now() - probeStart).count(),
                       probe->hitTrialLimit()};
    if (auto fitted = probe->memoryLine()) {
        done.fixedBytes = fitted->fixedBytes;
        done.bytesPerSample = fitted->bytesPerSample;
    }
    if (probe->hitTrialLimit()) {
        emit(Warning{now(), "the probe stopped at its trial limit (" + std::to_string(options.probe.maxTrials) +
                                "); using the largest size that fit, " + std::to_string(found)});
    }
    // The probe's last trial that fit warmed its size up for the timing.
    int64_t lastFit = 0;
    for (const TrialOutcome& trial : probe->history())
        if (trial.fit) lastFit = trial.size;
    probe.reset();
    // Training starts from an empty cache, as the probe's trials did and a fresh training loop
    // does: the blocks the trials left were split for other sizes, and a caching allocator (a
    // GPU's, a virtual one's model) would carve the chosen size's tensors out of them.
    meter->releaseCache();
    emit(done);
    setState(RunState::Training, "micro-batch " + std::to_string(found));
    startTiming(found, lastFit);
}

void Trainer::Impl::startTiming(int64_t largest, int64_t warmSize) {
    timing.reset();
    drift.reset();
    if (options.probe.objective != ProbeObjective::Fastest) return;
    ThroughputSearchOptions search;
    search.largest = largest;
    search.target = localTarget();  // with several devices, this rank's share
    search.multipleOf = options.probe.multipleOf;
    search.smallest = std::max(sizes.minMicroBatch, sizes.minPart);
    search.justRan = warmSize;
    search.start = sizes.lastChosen;
    timing.emplace(search);
    timingStart = Clock::now();
    if (timing->done()) finishTiming(timing->chosen());  // one size only: nothing to time
}

void Trainer::Impl::recordTiming(int64_t size, double seconds) {
    const int before = timing->timings();
    timing->record(size, seconds);
    // One event per finished timing (a warm-up, or micro-batches worth at least 50 ms), not one
    // per micro-batch: a fast model runs dozens of them per timing.
    if (timing->timings() != before) {
        for (const ThroughputSearch::Candidate& c : timing->candidates()) {
            if (c.microBatch != size) continue;
            emit(ThroughputTimed{now(), probeSequence, size, c.median(), static_cast<int>(c.samplesPerSecond.size())});
        }
    }
    if (timing->done()) finishTiming(timing->chosen());
}

void Trainer::Impl::finishTiming(int64_t size) {
    const ThroughputSearch& search = *timing;
    const int64_t largest = search.plan().empty() ? size : search.plan().front();
    sizes.microBatch = size;
    sizes.lastChosen = size;
    ThroughputChosen chosen;
    chosen.time = now();
    chosen.sequence = probeSequence;
    chosen.microBatch = size;
    chosen.largestMicroBatch = largest;
    chosen.accumulationSteps = static_cast<int64_t>(planFor(localTarget(), size).size());
    chosen.targetBatch = localTarget();
    chosen.samplesPerSecond = search.samplesPerSecond(size);
    chosen.largestSamplesPerSecond = search.samplesPerSecond(largest);
    chosen.speedOverLargest = search.overLargest(size);
    chosen.microBatchesTimed = search.spent();
    chosen.seconds = std::chrono::duration<double>(Clock::now() - timingStart).count();
    chosen.reason = search.reason();
    // The claim per whole training batch: the micro-batches' gain, less what every batch costs
    // besides them (the optimizer step, …), measured on the batches trained so far. Not claimed
    // before a clean batch has been measured (the search can decide in the batch after the
    // probe's, or be cut short by an OOM).
    if (stepCosts.measured()) {
        const StepCosts costs = stepCosts.costs();
        chosen.stepSeconds = costs.perStepSeconds;
        chosen.microBatchSeconds = costs.perMicroBatchSeconds;
        chosen.stepSpeedOverLargest = stepSpeedOverLargest(localTarget(), size, largest, chosen.largestSamplesPerSecond,
                                                           chosen.speedOverLargest, costs);
        if (size != largest && chosen.stepSpeedOverLargest > 0) {
            const double besides =
                costs.perStepSeconds + costs.perMicroBatchSeconds * static_cast<double>(chosen.accumulationSteps);
            chosen.reason += formatText(
                "; per training batch, with its %.0f ms besides the micro-batches, %.2fx the largest's speed",
                1000 * besides, chosen.stepSpeedOverLargest);
        }
    }
    emit(chosen);
    timing.reset();
    drift.reset();
    if (options.probe.retimeEvery > 0) drift.emplace(options.probe.retimeEvery, options.probe.retimeDrift);
}

std::optional<std::string> Trainer::Impl::switchTo(const DeviceSpec& next) {
    const std::string from = device.name();
    if (next.kind == DeviceKind::Virtual && meter->allocated() > next.budgetBytes) {
        return "cannot switch to " + next.name() + ": the model, its gradients and optimizer state already take " +
               formatBytes(meter->allocated()) + "; choose a budget above that";
    }
    const bool moves = (next.kind == DeviceKind::Cuda) != (device.kind == DeviceKind::Cuda) ||
                       (next.kind == DeviceKind::Cuda && next.index != device.index);
    if (moves) {
        const torch::Device target_device = torchDevice(next);
        model->to(target_device);
        parameters = model->parameters();
        optimizer->to(target_device, parameters);
        for (auto& g : gradients) g = g.to(target_device);
        linkGradients();
        // Several devices: the moved accumulators are no longer views into the buckets the
        // all-reduce sums; new buckets on the new device (zero: this is a batch boundary).
        if (parallel) bucketGradients();
        for (auto& held : reservation) held = held.to(target_device);
        meter->releaseCache();
        sizes.lastChosen = 0;  // other hardware: search from the largest again
    }
    device = next;
    stepCosts = StepCostWatch();  // what batches cost besides their micro-batches, on this device
    meter = openMeter(device);
    meterOpened();
    if (const std::string note = meter->limitNote(); !note.empty()) emit(Warning{now(), device.name() + ": " + note});
    emit(DeviceSwitched{now(), from, device.name(), parallel ? parallel->link->rank() : 0});
    reportSummary();
    return std::nullopt;
}

}  // namespace batchpilot::core
