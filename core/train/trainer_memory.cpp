// The trainer's memory reporting: samples of the meter, the breakdown of the device memory
// (parameters, gradients, optimizer state, activations), and the "does not fit" verdict.

#include "core/train/trainer_impl.h"

#include <filesystem>
#include <numeric>

#include "core/base/durable_file.h"
#include "core/memory/memory_snapshot.h"
#include "core/nn/activation_checkpoint.h"

namespace batchpilot::core {

int64_t trainer_detail::neededBytes(const MemoryMeter& meter, int64_t requested) {
    return std::max(meter.peak() + std::max(requested, meter.lastFailedAllocation()), meter.lastFailureNeed());
}

void Trainer::Impl::useMemorySavers(MemorySavers next) {
    learner.model->setCheckpointing(checkpoints(next));
    if (next != learner.savers) choice.stepCosts = StepCostWatch();  // other work per batch from now on
    learner.savers = next;
}

bool Trainer::Impl::nextMemorySavers(int64_t requested) {
    if (options.memorySavers != MemorySavers::Auto) return false;
    const int64_t needed = neededBytes(*hardware.meter, requested);  // before the survey's runs reset the peak
    const std::string nothing = "nothing fits on " + hardware.device.name() + " even at micro-batch " +
                                std::to_string(choice.sizes().minMicroBatch) +
                                (learner.savers == MemorySavers::Off ? "" : " with " + describeSavers(learner.savers)) +
                                " (needs ≈ " + formatBytes(needed) + ", " + formatBytes(usableBytes()) + " usable)";
    learner.saverChoices.autoTried.push_back(learner.savers);
    const SaverSurvey found = surveySavers(nothing);
    // The fastest that fits, of those auto has not tried yet in this run.
    const SaverOption* best = nullptr;
    for (const SaverOption& o : found.options) {
        const MemorySavers candidate = *parseMemorySavers(o.savers);
        if (!o.fits || std::find(learner.saverChoices.autoTried.begin(), learner.saverChoices.autoTried.end(),
                                 candidate) != learner.saverChoices.autoTried.end())
            continue;
        if (best == nullptr || o.samplesPerSecond > best->samplesPerSecond) best = &o;
    }
    if (best == nullptr) return false;
    const MemorySavers next = *parseMemorySavers(best->savers);
    emit(Warning{now(), nothing + ": memory savers auto turns on " + describeSavers(next) +
                            " (measured: the fastest that fits, micro-batch " + std::to_string(best->microBatch) +
                            ") and probes again"});
    return applySavers(next, "memory savers auto: " + nothing);
}

bool Trainer::Impl::applySavers(MemorySavers next, const std::string& why) {
    if (next == MemorySavers::Auto || next == learner.savers) return false;
    if (autocastsFp16(next) && !float16Unavailable().empty()) {
        emit(Warning{now(), describeSavers(next) + " is not available here: it " + float16Unavailable() +
                                "; the memory savers stay " + toString(learner.savers)});
        return false;
    }
    if (checkpoints(next) && !learner.model->checkpointingUnsupported().empty()) {
        emit(Warning{now(), describeSavers(next) +
                                " is not available for this model: " + learner.model->checkpointingUnsupported() +
                                "; the memory savers stay " + toString(learner.savers)});
        return false;
    }
    int64_t predicted = 0;
    if (learner.saverChoices.lastSurvey && learner.saverChoices.lastSurvey->device == hardware.device.name() &&
        learner.saverChoices.lastSurvey->targetBatch == localTarget()) {
        if (const SaverOption* o = findOption(*learner.saverChoices.lastSurvey, toString(next)))
            predicted = o->microBatch;
    }
    emit(MemorySaversChanged{now(), progress.step, toString(learner.savers), toString(next), why, predicted});
    useMemorySavers(next);
    hardware.meter->releaseCache();
    choice.forgetLastChoice();  // other savers, other speeds: the timings before say nothing
    startProbe(ProbeReason::MemorySavers, predicted > 0 ? predicted : choice.sizes().minMicroBatch, 0);
    return true;
}

SaverOption Trainer::Impl::measureSaver(MemorySavers candidate) {
    const int64_t upper = upperBound();
    useMemorySavers(candidate);
    std::vector<SaverTrial> trials;
    std::string failed;
    const auto run = [&](int64_t size) {
        std::vector<int64_t> indices(static_cast<size_t>(size));
        std::iota(indices.begin(), indices.end(), int64_t{0});
        // From an empty cache: on a caching allocator the peak counts reserved bytes, and what
        // training left cached would count against the first saver measured (on an H200 the
        // survey's "off" row said "does not fit" where training ran at micro-batch 34).
        hardware.meter->releaseCache();
        const MicroResult r = runMicroBatch(indices, 1.0, {}, /*measurement=*/true);
        hardware.meter->releaseCache();
        if (!r.ok && !r.failure.outOfMemory) {
            failed = r.failure.message.substr(0, r.failure.message.find('\n'));
            return false;
        }
        trials.push_back(
            {size, r.ok, r.ok ? r.peakBytes : neededBytes(*hardware.meter, r.failure.requestedBytes), r.seconds});
        return true;
    };
    bool ok = true;
    // A stop (Ctrl-C, SIGTERM, the window's Stop) ends the survey at the next measurement: it
    // waited ≈ 8.5 s for every saver to be measured.
    while (ok && !commands.stopRequested()) {
        const std::optional<int64_t> size = nextSurveySize(trials, usableBytes(), upper, choice.sizes().minMicroBatch);
        if (!size) break;
        ok = run(*size);
    }
    SaverOption o =
        predictSaver(toString(candidate), trials, usableBytes(), upper, localTarget(), choice.sizes().minMicroBatch);
    // A size's first run also prepares its kernels: where it is cheap, time it once more.
    if (ok && !commands.stopRequested() && o.samplesPerSecond > 0 &&
        static_cast<double>(o.timedMicroBatch) / o.samplesPerSecond < 2.0 && run(o.timedMicroBatch))
        o = predictSaver(toString(candidate), trials, usableBytes(), upper, localTarget(),
                         choice.sizes().minMicroBatch);
    if (!failed.empty()) {
        o.fits = false;
        o.unavailable = "it failed: " + failed;
    } else if (commands.stopRequested()) {
        o.fits = false;
        o.unavailable = "not measured: the run was stopped";
    }
    return o;
}

namespace {

/// The memory savers a survey measures on a device of `kind`. float16 on CUDA only: it holds what
/// bfloat16 holds, and where bfloat16 has no fast kernels (GPUs before Ampere) float16 does. A CPU
/// has fast kernels for neither.
std::vector<MemorySavers> surveyCandidates(DeviceKind kind) {
    std::vector<MemorySavers> candidates{MemorySavers::Off, MemorySavers::Checkpoint, MemorySavers::Bf16,
                                         MemorySavers::Both};
    if (kind == DeviceKind::Cuda) {
        candidates.push_back(MemorySavers::Fp16);
        candidates.push_back(MemorySavers::CheckpointFp16);
    }
    return candidates;
}

SaverOption unmeasured(MemorySavers candidate, std::string why) {
    SaverOption o;
    o.savers = toString(candidate);
    o.unavailable = std::move(why);
    return o;
}

}  // namespace

SaverSurvey Trainer::Impl::surveySavers(const std::string& reason) {
    const auto started = Clock::now();
    SaverSurvey survey;
    survey.step = progress.step;
    survey.device = hardware.device.name();
    survey.reason = reason;
    survey.usableBytes = usableBytes();
    survey.targetBatch = localTarget();
    survey.current = toString(learner.savers);
    const MemorySavers before = learner.savers;
    const std::string cannotSplit = learner.model->checkpointingUnsupported();
    // A survey leaves the run's random stream as it found it.
    torch::Tensor randomState;
    {
        CountingScope uncounted(false);
        randomState = cpuGeneratorState();
    }
    // Each run below adds its gradient to the accumulators, as training does (that is the memory
    // measured): what the batch had accumulated waits on the host and is put back afterwards.
    std::vector<torch::Tensor> accumulated;
    {
        torch::NoGradGuard noGrad;
        CountingScope uncounted(false);
        for (const auto& g : learner.gradients)
            accumulated.push_back(g.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
    }
    for (const MemorySavers candidate : surveyCandidates(hardware.device.kind)) {
        if (commands.stopRequested())
            survey.options.push_back(unmeasured(candidate, "not measured: the run was stopped"));
        else if (checkpoints(candidate) && !cannotSplit.empty())
            survey.options.push_back(unmeasured(candidate, cannotSplit));
        else
            survey.options.push_back(measureSaver(candidate));
    }
    useMemorySavers(before);
    {
        torch::NoGradGuard noGrad;
        CountingScope inPlace(false);
        for (size_t i = 0; i < learner.gradients.size(); ++i) learner.gradients[i].copy_(accumulated[i]);
    }
    hardware.meter->releaseCache();
    setCpuGeneratorState(randomState);
    if (const std::optional<size_t> pick = suggestSaver(survey.options, survey.current))
        survey.suggestion = survey.options[*pick].savers;
    survey.advice = saverAdvice(survey);
    survey.time = now();
    survey.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    learner.saverChoices.lastSurvey = survey;
    emit(survey);
    return survey;
}

AllocationFailure Trainer::Impl::cachingFailure() const {
    const AllocatorFailureView view = hardware.meter->lastAllocatorFailure();
    // The allocator's latest OOM, when this run raised it (the allocator outlives a run).
    if (view.number <= hardware.reported.failuresBefore) return {};
    return view.failure;
}

void Trainer::Impl::doesNotFit(int64_t requested, bool duringSetup, bool suggestSavers) {
    const int64_t needed = neededBytes(*hardware.meter, requested);
    std::string what = duringSetup ? "the model's parameters and gradients do not fit on " + hardware.device.name()
                                   : "the model does not fit on " + hardware.device.name() + " even at micro-batch " +
                                         std::to_string(choice.sizes().minMicroBatch);
    if (!duringSetup && learner.savers != MemorySavers::Off) what += " with " + describeSavers(learner.savers);
    // Measured before the advice below, which it comes first in when it applies.
    std::string saver;
    if (!duringSetup && suggestSavers && options.memorySavers != MemorySavers::Auto) {
        const SaverSurvey found = surveySavers(what);
        if (const SaverOption* o = findOption(found, found.suggestion)) {
            saver = "; with " + describeSaverName(o->savers) + " it fits (measured: micro-batch " +
                    std::to_string(o->microBatch) + ", " + formatText("%.3g", o->samplesPerSecond) +
                    " samples/s, the fastest that fits): train with --memory-savers " + o->savers + " (or auto), or";
        }
    }
    // Under a caching allocator (a GPU, a virtual one with its model) what runs out is reserved
    // memory: the segments held at the failure and the one it tried to add, which can be far more
    // than the tensors need (a 1-10 MiB tensor takes a 20 MiB segment).
    const AllocationFailure held = cachingFailure();
    const int64_t reservedNeed = held.segmentBytes > 0 ? held.reservedBytes + held.segmentBytes : 0;
    std::string segments;
    if (reservedNeed > needed) {
        // The remedy PyTorch's own message names, unless it is in use already.
        const bool remedy = held.fragmentation && !expandableSegmentsOn(hardware.device);
        segments = " of tensors, in PyTorch's caching allocator " + formatBytes(reservedNeed) + " of segments (" +
                   formatBytes(held.reservedBytes) + " reserved and " + formatBytes(held.segmentBytes) +
                   " more it tried to reserve" + (remedy ? "; fragmentation: expandable_segments:True may help" : "") +
                   ")";
    }
    // With a large headroom, what fits is the usable part, not the capacity: say which stopped it.
    const bool headroomStopsIt =
        std::max(needed, reservedNeed) <= hardware.meter->capacity() && options.probe.headroom > 0;
    const std::string has =
        headroomStopsIt ? ", but only " + formatBytes(usableBytes()) + " of its " +
                              formatBytes(hardware.meter->capacity()) + " are usable with headroom " +
                              formatText("%g", options.probe.headroom) + saver + (saver.empty() ? "; " : " ") +
                              "lower the headroom (--headroom), or choose a smaller model or smaller inputs"
                        : ", has " + formatBytes(hardware.meter->capacity()) + saver + (saver.empty() ? "; " : " ") +
                              "choose a larger device or budget, a smaller model or smaller inputs";
    throw FatalError{what + ": needs ≈ " + formatBytes(needed) + segments + has,
                     duringSetup ? "setup" : "step " + std::to_string(progress.step + 1)};
}

void Trainer::Impl::sampleMemory(bool force) {
    const double t = now();
    if (!force && t - hardware.reported.lastSample < options.memorySampleInterval) return;
    hardware.reported.lastSample = t;
    emit(MemorySample{t, hardware.meter->allocated(), hardware.meter->reserved(), hardware.meter->peak(),
                      hardware.meter->capacity(), usableBytes()});
}

void Trainer::Impl::reportBreakdown() {
    MemoryBreakdown b;
    b.time = now();
    b.step = progress.step;
    b.device = hardware.device.name();
    if (learner.savers != MemorySavers::Off) b.memorySavers = toString(learner.savers);
    b.totalBytes = hardware.meter->total();
    b.capacityBytes = hardware.meter->capacity();
    b.usableBytes = usableBytes();
    b.parameterBytes = hardware.ledger.parameterBytes;
    b.gradientBytes = hardware.ledger.gradientBytes;
    for (const auto& g : learner.gradients)
        b.largestGradientBytes = std::max(b.largestGradientBytes, static_cast<int64_t>(g.nbytes()));
    b.optimizerStateReserved = !learner.optimizer->stateReady() && !learner.reservation.empty();
    b.optimizerStateBytes = learner.optimizer->stateReady()
                                ? hardware.ledger.optimizerStateBytes
                                : (learner.reservation.empty() ? 0 : learner.optimizer->stateBytes());
    if (hardware.ledger.lastPeak.size > 0) {
        b.residentBytes = hardware.ledger.lastPeak.resident;
        // The parts are what tensors held at the peak; what the allocator held beyond them (its
        // cache, the rounding of blocks and segments) is a part of its own.
        b.peakBytes = hardware.ledger.lastPeak.peakAllocated;
        b.cacheBytes = std::max<int64_t>(0, hardware.ledger.lastPeak.peak - hardware.ledger.lastPeak.peakAllocated);
        b.activationMicroBatch = hardware.ledger.lastPeak.size;
        b.inputBytes = hardware.ledger.lastPeak.input;
        // The micro-batch's own copy is in its peak; the batch's copy, taken before it, is resident.
        b.bufferCopyBytes = hardware.ledger.lastPeak.bufferCopy + hardware.ledger.lastPeak.batchCopy;
        b.activationBytes =
            std::max<int64_t>(0, hardware.ledger.lastPeak.peakAllocated - hardware.ledger.lastPeak.resident -
                                     hardware.ledger.lastPeak.input - hardware.ledger.lastPeak.bufferCopy);
    } else {
        // Before any micro-batch: what is resident is the whole story.
        b.residentBytes = hardware.meter->allocated();
        b.peakBytes = b.residentBytes;
        b.cacheBytes = std::max<int64_t>(0, hardware.meter->reserved() - hardware.meter->allocated());
    }
    b.otherProcessBytes = hardware.meter->otherProcesses();
    b.contextBytes = hardware.meter->contextBytes();
    b.workspaceBytes = hardware.meter->workspaceBytes();
    b.freeBytes =
        std::max<int64_t>(0, b.totalBytes - b.peakBytes - b.cacheBytes - b.otherProcessBytes - b.contextBytes);
    emit(std::move(b));
    // The segments after a step barely change once the cache is warm: reported when they do.
    std::vector<SegmentView> segments = hardware.meter->segments();
    if (!segments.empty() && segments != hardware.reported.segments) {
        hardware.reported.segments = segments;
        AllocatorSegments report;
        report.time = now();
        report.step = progress.step;
        report.limitBytes = hardware.meter->capacity();
        report.segments = std::move(segments);
        emit(std::move(report));
    }
}

void Trainer::Impl::meterOpened() {
    hardware.reported.segments.clear();
    // An earlier run's OOMs are not this one's.
    hardware.reported.failures = hardware.reported.failuresBefore = hardware.meter->lastAllocatorFailure().number;
    hardware.reported.allocatorRetries = hardware.meter->allocatorRetries();
    hardware.reported.allocatorOoms = hardware.meter->allocatorOoms();
}

void Trainer::Impl::reportFailureSegments() {
    AllocatorFailureView failure = hardware.meter->lastAllocatorFailure();
    if (failure.number == hardware.reported.failures || failure.segments.empty()) return;
    hardware.reported.failures = failure.number;
    AllocatorSegments report;
    report.time = now();
    report.step = progress.step;
    report.atOom = true;
    report.limitBytes = failure.failure.limitBytes;
    report.requestedBytes = failure.failure.requestedBytes;
    report.segmentBytes = failure.failure.segmentBytes;
    report.largestFreeBlock = failure.failure.largestFreeBlock;
    report.fragmentation = failure.failure.fragmentation;
    report.segments = std::move(failure.segments);
    emit(std::move(report));
}

std::string Trainer::Impl::snapshotAtOom() {
    if (options.runFolder.empty() || hardware.reported.snapshots >= kMaxOomSnapshots) return {};
    const AllocatorFailureView failure = hardware.meter->lastAllocatorFailure();
    // An OOM this run's allocator raised, each once: an injected fault, an exact virtual device or
    // the CPU has no segments to show, and an earlier run's OOM is not this one's.
    const int64_t written = std::max(hardware.reported.failuresBefore, hardware.reported.snapshotted);
    if (failure.number <= written || failure.segments.empty()) return {};
    hardware.reported.snapshotted = failure.number;
    // Named by rank and by this rank's count: ranks sharing a folder, and OOMs, never overwrite
    // each other.
    const int rank = parallel ? parallel->link->rank() : 0;
    const std::string name = formatText("oom-snapshot-rank%d-%02d.pickle", rank, hardware.reported.snapshots + 1);
    const std::string path = (std::filesystem::path(options.runFolder) / name).string();
    if (auto saved = replaceFileAtomically(path, memorySnapshotPickle(failure.segments), "the memory snapshot " + path);
        !saved) {
        emit(Warning{now(), saved.error()});
        return {};
    }
    if (++hardware.reported.snapshots == kMaxOomSnapshots) {
        emit(Warning{now(), formatText("%d memory snapshots were written at OOMs, the most one run keeps: later OOMs "
                                       "are not snapshotted",
                                       kMaxOomSnapshots)});
    }
    return name;
}

void Trainer::Impl::reportSummary() {
    RunSummary summary;
    summary.time = now();
    summary.device = hardware.device.name();
    summary.model = learner.model->name();
    summary.parameterCount = learner.model->parameterCount();
    summary.parameterTensors = static_cast<int64_t>(learner.parameters.size());
    summary.dataset = feed.training->name();
    summary.datasetSize = feed.training->size();
    summary.inputShape = feed.training->sampleShape();
    summary.optimizer = std::string(toString(options.optimizer.kind)) + ", learning rate " +
                        formatText("%g", learner.optimizer->learningRate());
    summary.loss = toString(options.loss);
    summary.targetBatch = progress.target;
    summary.batchStatistics = learner.model->usesBatchStatistics();
    emit(std::move(summary));
}

std::vector<SegmentView> virtualGpuSegments(bool* atOom) {
    const auto& allocator = CountingAllocator::instance();
    std::vector<SegmentView> segments = allocator.segmentsAtLastFailure();
    if (atOom != nullptr) *atOom = !segments.empty();
    if (segments.empty()) segments = allocator.segments();
    return segments;
}

}  // namespace batchpilot::core
