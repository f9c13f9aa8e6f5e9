// The trainer's memory reporting: samples of the meter, the breakdown of the device memory
// (parameters, gradients, optimizer state, activations), and the "does not fit" verdict.

#include "core/trainer_impl.h"

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
    savers = next;
}

bool Trainer::Impl::nextMemorySavers(int64_t requested) {
    if (options.memorySavers != MemorySavers::Auto) return false;
    const std::optional<MemorySavers> next = nextAutoSavers(savers, model->checkpointingUnsupported().empty());
    if (!next) return false;
    const int64_t needed = neededBytes(*meter, requested);
    emit(Warning{now(), "nothing fits on " + device.name() + " even at micro-batch " + std::to_string(minMicroBatch) +
                            (savers == MemorySavers::Off ? "" : " with " + describeSavers(savers)) + " (needs ≈ " +
                            formatBytes(needed) + ", " + formatBytes(usableBytes()) +
                            " usable): memory savers auto turns on " + describeSavers(*next) + " and probes again"});
    useMemorySavers(*next);
    meter->releaseCache();
    lastChosen = 0;  // other savers, other speeds: the timings before say nothing
    startProbe(ProbeReason::MemorySavers, minMicroBatch, 0);
    return true;
}

std::optional<MemorySavers> Trainer::Impl::saverThatFits() {
    if (!model || !data || data->size() < minMicroBatch) return std::nullopt;
    const MemorySavers before = savers;
    const bool canCheckpoint = model->checkpointingUnsupported().empty();
    std::vector<int64_t> indices;
    for (int64_t i = 0; i < minMicroBatch; ++i) indices.push_back(i);
    std::optional<MemorySavers> found;
    for (std::optional<MemorySavers> candidate = nextAutoSavers(MemorySavers::Off, canCheckpoint); candidate;
         candidate = nextAutoSavers(*candidate, canCheckpoint)) {
        if (*candidate == before) continue;
        useMemorySavers(*candidate);
        const MicroResult r = runMicroBatch(indices, 1.0, {}, /*keepGradients=*/false);
        meter->releaseCache();
        if (r.ok && r.peakBytes <= usableBytes()) {
            found = *candidate;
            break;
        }
    }
    useMemorySavers(before);
    return found;
}

void Trainer::Impl::doesNotFit(int64_t requested, bool duringSetup, bool suggestSavers) {
    const int64_t needed = neededBytes(*meter, requested);
    std::string what = duringSetup ? "the model's parameters and gradients do not fit on " + device.name()
                                   : "the model does not fit on " + device.name() + " even at micro-batch " +
                                         std::to_string(minMicroBatch);
    if (!duringSetup && savers != MemorySavers::Off) what += " with " + describeSavers(savers);
    // Measured before the advice below, which it comes first in when it applies.
    std::string saver;
    if (!duringSetup && suggestSavers && options.memorySavers != MemorySavers::Auto) {
        if (const std::optional<MemorySavers> fits = saverThatFits()) {
            saver = "; with " + describeSavers(*fits) + " it fits (measured at micro-batch " +
                    std::to_string(minMicroBatch) + "): train with --memory-savers " + toString(*fits) +
                    " (or auto), or";
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
    if (!force && t - lastMemorySample < options.memorySampleInterval) return;
    lastMemorySample = t;
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
    b.optimizerStateReserved = !optimizer->stateReady() && reservation.defined();
    b.optimizerStateBytes =
        optimizer->stateReady() ? ledger.optimizerStateBytes : (reservation.defined() ? optimizer->stateBytes() : 0);
    if (ledger.lastPeak.size > 0) {
        b.residentBytes = ledger.lastPeak.resident;
        b.peakBytes = ledger.lastPeak.peak;
        b.activationBytes = std::max<int64_t>(0, ledger.lastPeak.peak - ledger.lastPeak.resident);
        b.activationMicroBatch = ledger.lastPeak.size;
    } else {
        // Before any micro-batch: what is resident is the whole story.
        b.residentBytes = meter->allocated();
        b.peakBytes = b.residentBytes;
    }
    b.cacheBytes = std::max<int64_t>(0, meter->reserved() - std::max(b.peakBytes, meter->allocated()));
    b.otherProcessBytes = meter->otherProcesses();
    b.freeBytes = std::max<int64_t>(0, b.totalBytes - b.peakBytes - b.cacheBytes - b.otherProcessBytes);
    emit(std::move(b));
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

}  // namespace batchpilot::core
