// The trainer's probe sessions and fastest-size timings (core/plan/size_choice.h decides; this
// holds back the optimizer state, empties the cache and tells), and the device switch that ends
// in a new probe.

#include "core/base/text_format.h"
#include "core/train/trainer_impl.h"

namespace batchpilot::core {

void Trainer::Impl::startProbe(ProbeReason reason, int64_t initial, int64_t knownFit) {
    choice.startProbe(reason, options.probe, upperBound(), usableBytes(), initial, knownFit, Clock::now());
    if (!learner.optimizer->stateReady() && learner.reservation.empty() && learner.optimizer->stateBytes() > 0) {
        // LibTorch-style optimizers create their state in the first step: hold that much now so
        // the probe does not pick a size that runs out of memory at the first step.
        try {
            learner.reservation = learner.optimizer->reserveState();
        } catch (const std::exception&) {
            const FailureInfo failure = classifyFailure(std::current_exception());
            if (!failure.outOfMemory) throw;
            doesNotFit(failure.requestedBytes, /*duringSetup=*/false, /*suggestSavers=*/false);
        }
    }
    setState(RunState::Probing, toString(reason));
    emit(ProbeStarted{now(), choice.sequence(), reason, hardware.device.name(), upperBound(), usableBytes(),
                      learner.reservation.empty() ? 0 : learner.optimizer->stateBytes()});
}

void Trainer::Impl::finishProbe() {
    const ProbeSearch& probe = choice.probe();
    if (probe.result() <= 0) {
        // Out of trials before it got down to the smallest size: that says nothing of whether
        // the model fits ("not even at micro-batch 1" would be untrue).
        int64_t smallest = std::numeric_limits<int64_t>::max();
        for (const TrialOutcome& trial : probe.history()) smallest = std::min(smallest, trial.size);
        if (probe.hitTrialLimit() && smallest > choice.sizes().minMicroBatch) {
            throw badInput("the probe used up its " + std::to_string(options.probe.maxTrials) +
                               " trial(s) (--max-trials) before any micro-batch fit: the smallest it tried was " +
                               std::to_string(smallest) +
                               "; allow more trials, or start lower with --initial-micro-batch",
                           "configuration");
        }
        if (nextMemorySavers(0)) return;  // probes again, with memory savers
        doesNotFit(0);
    }
    const SizeChoice::ProbeEnd end = choice.finishProbe(localTarget(), now(), Clock::now());
    const int64_t found = end.finished.microBatch;
    // A small micro-batch where a larger one would help: every saver is measured at the next
    // training batch (applyCommands), and the fastest suggested. Not after a probe that a saver
    // change itself started, nor after a regrow or a re-probe of the same setting.
    if (end.newSetting && !parallel && found < options.saverThreshold && found < upperBound()) {
        learner.saverChoices.surveyDue = "the probe found micro-batch " + std::to_string(found) + ", below " +
                                         std::to_string(options.saverThreshold) + " (the saver threshold)";
    }
    if (end.finished.hitTrialLimit) {
        emit(Warning{now(), "the probe stopped at its trial limit (" + std::to_string(options.probe.maxTrials) +
                                "); using the largest size that fit, " + std::to_string(found)});
    }
    // Training starts from an empty cache, as the probe's trials did and a fresh training loop
    // does: the blocks the trials left were split for other sizes, and a caching allocator (a
    // GPU's, a virtual one's model) would carve the chosen size's tensors out of them.
    hardware.meter->releaseCache();
    emit(end.finished);
    setState(RunState::Training, "micro-batch " + std::to_string(found));
    startTiming(found, end.lastFit);  // the probe's last trial that fit warmed its size up
}

void Trainer::Impl::startTiming(int64_t largest, int64_t warmSize) {
    // With several devices the search times this rank's share. The run's steps still to come bound
    // what the timing may train (SizeChoice::kTimingShare); an open-ended run gives it no bound.
    const int64_t total = totalSteps();
    const int64_t stepsLeft = total > 0 ? std::max<int64_t>(1, total - progress.step) : 0;
    if (choice.startTiming(options.probe, largest, localTarget(), warmSize, Clock::now(), stepsLeft))
        finishTiming(choice.search().chosen());
}

void Trainer::Impl::searchDecided() {
    if (!choice.startBatchCheck(options.probe)) finishTiming(choice.search().chosen());
}

void Trainer::Impl::finishTiming(int64_t size) {
    emit(choice.finishTiming(size, localTarget(), options.probe, now(), Clock::now()));
}

std::optional<std::string> Trainer::Impl::switchTo(const DeviceSpec& next) {
    const std::string from = hardware.device.name();
    if (next.kind == DeviceKind::Virtual && hardware.meter->allocated() > next.budgetBytes) {
        return "cannot switch to " + next.name() + ": the model, its gradients and optimizer state already take " +
               formatBytes(hardware.meter->allocated()) + "; choose a budget above that";
    }
    const bool moves = (next.kind == DeviceKind::Cuda) != (hardware.device.kind == DeviceKind::Cuda) ||
                       (next.kind == DeviceKind::Cuda && next.index != hardware.device.index);
    if (moves) {
        const torch::Device target_device = torchDevice(next);
        learner.model->to(target_device);
        learner.parameters = learner.model->parameters();
        learner.optimizer->to(target_device, learner.parameters);
        for (auto& g : learner.gradients) g = g.to(target_device);
        linkGradients();
        // Several devices: the moved accumulators are no longer views into the buckets the
        // all-reduce sums; new buckets on the new device (zero: this is a batch boundary).
        if (parallel) bucketGradients();
        for (auto& held : learner.reservation) held = held.to(target_device);
        hardware.meter->releaseCache();
        choice.forgetLastChoice();  // other hardware: search from the largest again
    }
    hardware.device = next;
    choice.stepCosts = StepCostWatch();  // what batches cost besides their micro-batches, on this device
    hardware.meter = openMeter(hardware.device);
    meterOpened();
    if (const std::string note = hardware.meter->limitNote(); !note.empty())
        emit(Warning{now(), hardware.device.name() + ": " + note});
    emit(DeviceSwitched{now(), from, hardware.device.name(), parallel ? parallel->link->rank() : 0});
    reportSummary();
    if (hardware.device.name() != from) {
        startProbe(ProbeReason::DeviceSwitch,
                   choice.sizes().microBatch > 0 ? choice.sizes().microBatch : options.probe.initialMicroBatch, 0);
    }
    return std::nullopt;
}

}  // namespace batchpilot::core
