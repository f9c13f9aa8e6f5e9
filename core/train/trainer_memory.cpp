// The trainer's memory reporting: samples of the meter, the breakdown of the device memory
// (parameters, gradients, optimizer state, activations), and the "does not fit" verdict.

#include "core/train/trainer_impl.h"

#include <numeric>

namespace batchpilot::core {

namespace {

/// The bytes the failed allocation needed: the peak since the last reset (which includes what
/// stayed allocated) plus the request, or what the meter recorded of the failure.
int64_t neededBytes(const MemoryMeter& meter, int64_t requested) {
    return std::max(meter.peak() + std::max(requested, meter.lastFailedAllocation()), meter.lastFailureNeed());
}

}  // namespace

void Trainer::Impl::useMemorySavers(MemorySavers next) {
    model->setCheckpointing(checkpoints(next));
    if (next != savers) choice.stepCosts = StepCostWatch();  // other work per batch from now on
    savers = next;
}

bool Trainer::Impl::nextMemorySavers(int64_t requested) {
    if (options.memorySavers != MemorySavers::Auto) return false;
    const int64_t needed = neededBytes(*meter, requested);  // before the survey's runs reset the peak
    const std::string nothing = "nothing fits on " + device.name() + " even at micro-batch " +
                                std::to_string(choice.sizes.minMicroBatch) +
                                (savers == MemorySavers::Off ? "" : " with " + describeSavers(savers)) + " (needs ≈ " +
                                formatBytes(needed) + ", " + formatBytes(usableBytes()) + " usable)";
    saverChoices.autoTried.push_back(savers);
    const SaverSurvey found = surveySavers(nothing);
    // The fastest that fits, of those auto has not tried yet in this run.
    const SaverOption* best = nullptr;
    for (const SaverOption& o : found.options) {
        const MemorySavers candidate = *parseMemorySavers(o.savers);
        if (!o.fits || std::find(saverChoices.autoTried.begin(), saverChoices.autoTried.end(), candidate) !=
                           saverChoices.autoTried.end())
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
    if (next == MemorySavers::Auto || next == savers) return false;
    if (autocastsFp16(next) && !float16Unavailable().empty()) {
        emit(Warning{now(), describeSavers(next) + " is not available here: it " + float16Unavailable() +
                                "; the memory savers stay " + toString(savers)});
        return false;
    }
    if (checkpoints(next) && !model->checkpointingUnsupported().empty()) {
        emit(Warning{now(), describeSavers(next) + " is not available for this model: " +
                                model->checkpointingUnsupported() + "; the memory savers stay " + toString(savers)});
        return false;
    }
    int64_t predicted = 0;
    if (saverChoices.lastSurvey && saverChoices.lastSurvey->device == device.name() &&
        saverChoices.lastSurvey->targetBatch == localTarget()) {
        if (const SaverOption* o = findOption(*saverChoices.lastSurvey, toString(next))) predicted = o->microBatch;
    }
    emit(MemorySaversChanged{now(), step, toString(savers), toString(next), why, predicted});
    useMemorySavers(next);
    meter->releaseCache();
    choice.sizes.lastChosen = 0;  // other savers, other speeds: the timings before say nothing
    startProbe(ProbeReason::MemorySavers, predicted > 0 ? predicted : choice.sizes.minMicroBatch, 0);
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
        meter->releaseCache();
        const MicroResult r = runMicroBatch(indices, 1.0, {}, /*measurement=*/true);
        meter->releaseCache();
        if (!r.ok && !r.failure.outOfMemory) {
            failed = r.failure.message.substr(0, r.failure.message.find('\n'));
            return false;
        }
        trials.push_back({size, r.ok, r.ok ? r.peakBytes : neededBytes(*meter, r.failure.requestedBytes), r.seconds});
        return true;
    };
    bool ok = true;
    // A stop (Ctrl-C, SIGTERM, the window's Stop) ends the survey at the next measurement: it
    // waited ≈ 8.5 s for every saver to be measured.
    while (ok && !commands.stopRequested()) {
        const std::optional<int64_t> size = nextSurveySize(trials, usableBytes(), upper, choice.sizes.minMicroBatch);
        if (!size) break;
        ok = run(*size);
    }
    SaverOption o =
        predictSaver(toString(candidate), trials, usableBytes(), upper, localTarget(), choice.sizes.minMicroBatch);
    // A size's first run also prepares its kernels: where it is cheap, time it once more.
    if (ok && !commands.stopRequested() && o.samplesPerSecond > 0 &&
        static_cast<double>(o.timedMicroBatch) / o.samplesPerSecond < 2.0 && run(o.timedMicroBatch))
        o = predictSaver(toString(candidate), trials, usableBytes(), upper, localTarget(), choice.sizes.minMicroBatch);
    if (!failed.empty()) {
        o.fits = false;
        o.unavailable = "it failed: " + failed;
    } else if (commands.stopRequested()) {
        o.fits = false;
        o.unavailable = "not measured: the run was stopped";
    }
    return o;
}

SaverSurvey Trainer::Impl::surveySavers(const std::string& reason) {
    const auto started = Clock::now();
    SaverSurvey survey;
    survey.step = step;
    survey.device = device.name();
    survey.reason = reason;
    survey.usableBytes = usableBytes();
    survey.targetBatch = localTarget();
    survey.current = toString(savers);
    const MemorySavers before = savers;
    const std::string cannotSplit = model->checkpointingUnsupported();
    // Random layers (dropout) draw from the CPU's generator: it is put back afterwards, so that a
    // survey leaves the run's random stream as it found it.
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    torch::Tensor randomState;
    {
        CountingScope uncounted(false);
        const std::lock_guard<std::mutex> lock(generator.mutex());
        randomState = generator.get_state();
    }
    // float16 on CUDA only: it holds what bfloat16 holds, and where bfloat16 has no fast kernels
    // (GPUs before Ampere) float16 does. A CPU has fast kernels for neither.
    std::vector<MemorySavers> candidates{MemorySavers::Off, MemorySavers::Checkpoint, MemorySavers::Bf16,
                                         MemorySavers::Both};
    if (device.kind == DeviceKind::Cuda) {
        candidates.push_back(MemorySavers::Fp16);
        candidates.push_back(MemorySavers::CheckpointFp16);
    }
    // Each run below adds its gradient to the accumulators, as training does (that is the memory
    // measured): what the batch had accumulated waits on the host and is put back afterwards.
    std::vector<torch::Tensor> accumulated;
    {
        torch::NoGradGuard noGrad;
        CountingScope uncounted(false);
        for (const auto& g : gradients) accumulated.push_back(g.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
    }
    for (const MemorySavers candidate : candidates) {
        if (commands.stopRequested()) {
            SaverOption o;
            o.savers = toString(candidate);
            o.unavailable = "not measured: the run was stopped";
            survey.options.push_back(std::move(o));
            continue;
        }
        if (checkpoints(candidate) && !cannotSplit.empty()) {
            SaverOption o;
            o.savers = toString(candidate);
            o.unavailable = cannotSplit;
            survey.options.push_back(std::move(o));
        } else {
            survey.options.push_back(measureSaver(candidate));
        }
    }
    useMemorySavers(before);
    {
        torch::NoGradGuard noGrad;
        CountingScope inPlace(false);
        for (size_t i = 0; i < gradients.size(); ++i) gradients[i].copy_(accumulated[i]);
    }
    meter->releaseCache();
    {
        CountingScope uncounted(false);
        const std::lock_guard<std::mutex> lock(generator.mutex());
        generator.set_state(randomState);
    }
    if (const std::optional<size_t> pick = suggestSaver(survey.options, survey.current))
        survey.suggestion = survey.options[*pick].savers;
    survey.advice = saverAdvice(survey);
    survey.time = now();
    survey.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    saverChoices.lastSurvey = survey;
    emit(survey);
    return survey;
}

void Trainer::Impl::doesNotFit(int64_t requested, bool duringSetup, bool suggestSavers) {
    const int64_t needed = neededBytes(*meter, requested);
    std::string what = duringSetup ? "the model's parameters and gradients do not fit on " + device.name()
                                   : "the model does not fit on " + device.name() + " even at micro-batch " +
                                         std::to_string(choice.sizes.minMicroBatch);
    if (!duringSetup && savers != MemorySavers::Off) what += " with " + describeSavers(savers);
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
    // With a large headroom, what fits is the usable part, not the capacity: say which stopped it.
    const bool headroomStopsIt = needed <= meter->capacity() && options.probe.headroom > 0;
    const std::string has = headroomStopsIt
                                ? ", but only " + formatBytes(usableBytes()) + " of its " +
                                      formatBytes(meter->capacity()) + " are usable with headroom " +
                                      formatText("%g", options.probe.headroom) + saver + (saver.empty() ? "; " : " ") +
                                      "lower the headroom (--headroom), or choose a smaller model or smaller inputs"
                                : ", has " + formatBytes(meter->capacity()) + saver + (saver.empty() ? "; " : " ") +
                                      "choose a larger device or budget, a smaller model or smaller inputs";
    throw FatalError{what + ": needs ≈ " + formatBytes(needed) + has,
                     duringSetup ? "setup" : "step " + std::to_string(step + 1)};
}

void Trainer::Impl::sampleMemory(bool force) {
    const double t = now();
    if (!force && t - reported.lastSample < options.memorySampleInterval) return;
    reported.lastSample = t;
    emit(MemorySample{t, meter->allocated(), meter->reserved(), meter->peak(), meter->capacity(), usableBytes()});
}

void Trainer::Impl::reportBreakdown() {
    MemoryBreakdown b;
    b.time = now();
    b.step = step;
    b.device = device.name();
    if (savers != MemorySavers::Off) b.memorySavers = toString(savers);
    b.totalBytes = meter->total();
    b.capacityBytes = meter->capacity();
    b.usableBytes = usableBytes();
    b.parameterBytes = ledger.parameterBytes;
    b.gradientBytes = ledger.gradientBytes;
    for (const auto& g : gradients)
        b.largestGradientBytes = std::max(b.largestGradientBytes, static_cast<int64_t>(g.nbytes()));
    b.optimizerStateReserved = !optimizer->stateReady() && !reservation.empty();
    b.optimizerStateBytes =
        optimizer->stateReady() ? ledger.optimizerStateBytes : (reservation.empty() ? 0 : optimizer->stateBytes());
    if (ledger.lastPeak.size > 0) {
        b.residentBytes = ledger.lastPeak.resident;
        // The parts are what tensors held at the peak; what the allocator held beyond them (its
        // cache, the rounding of blocks and segments) is a part of its own.
        b.peakBytes = ledger.lastPeak.peakAllocated;
        b.cacheBytes = std::max<int64_t>(0, ledger.lastPeak.peak - ledger.lastPeak.peakAllocated);
        b.activationMicroBatch = ledger.lastPeak.size;
        b.inputBytes = ledger.lastPeak.input;
        // The micro-batch's own copy is in its peak; the batch's copy, taken before it, is resident.
        b.bufferCopyBytes = ledger.lastPeak.bufferCopy + ledger.lastPeak.batchCopy;
        b.activationBytes = std::max<int64_t>(0, ledger.lastPeak.peakAllocated - ledger.lastPeak.resident -
                                                     ledger.lastPeak.input - ledger.lastPeak.bufferCopy);
    } else {
        // Before any micro-batch: what is resident is the whole story.
        b.residentBytes = meter->allocated();
        b.peakBytes = b.residentBytes;
        b.cacheBytes = std::max<int64_t>(0, meter->reserved() - meter->allocated());
    }
    b.otherProcessBytes = meter->otherProcesses();
    b.contextBytes = meter->contextBytes();
    b.workspaceBytes = meter->workspaceBytes();
    b.freeBytes =
        std::max<int64_t>(0, b.totalBytes - b.peakBytes - b.cacheBytes - b.otherProcessBytes - b.contextBytes);
    emit(std::move(b));
    // The segments after a step barely change once the cache is warm: reported when they do.
    std::vector<SegmentView> segments = meter->segments();
    if (!segments.empty() && segments != reported.segments) {
        reported.segments = segments;
        AllocatorSegments report;
        report.time = now();
        report.step = step;
        report.limitBytes = meter->capacity();
        report.segments = std::move(segments);
        emit(std::move(report));
    }
}

void Trainer::Impl::meterOpened() {
    reported.segments.clear();
    reported.failures = meter->lastAllocatorFailure().number;  // an earlier run's are not this one's
}

void Trainer::Impl::reportFailureSegments() {
    AllocatorFailureView failure = meter->lastAllocatorFailure();
    if (failure.number == reported.failures || failure.segments.empty()) return;
    reported.failures = failure.number;
    AllocatorSegments report;
    report.time = now();
    report.step = step;
    report.atOom = true;
    report.limitBytes = failure.failure.limitBytes;
    report.requestedBytes = failure.failure.requestedBytes;
    report.segmentBytes = failure.failure.segmentBytes;
    report.largestFreeBlock = failure.failure.largestFreeBlock;
    report.fragmentation = failure.failure.fragmentation;
    report.segments = std::move(failure.segments);
    emit(std::move(report));
}

void Trainer::Impl::reportSummary() {
    RunSummary summary;
    summary.time = now();
    summary.device = device.name();
    summary.model = model->name();
    summary.parameterCount = model->parameterCount();
    summary.parameterTensors = static_cast<int64_t>(parameters.size());
    summary.dataset = data->name();
    summary.datasetSize = data->size();
    summary.inputShape = data->sampleShape();
    summary.optimizer = std::string(toString(options.optimizer.kind)) + ", learning rate " +
                        formatText("%g", optimizer->learningRate());
    summary.loss = toString(options.loss);
    summary.targetBatch = target;
    summary.batchStatistics = model->usesBatchStatistics();
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
