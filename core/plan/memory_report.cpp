#include "core/plan/memory_report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>

#include "core/plan/accumulation_plan.h"
#include "core/base/byte_size.h"
#include "core/plan/saver_survey.h"
#include "core/base/text_format.h"

namespace batchpilot::core {
namespace {

/// "3.1 MiB", "512 KiB", "210 MiB": two or three significant digits, in the unit that fits.
std::string approximate(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int unit = 0;
    double value = std::abs(bytes);
    while (value >= 1024.0 && unit < 4) {
        value /= 1024.0;
        ++unit;
    }
    const char* sign = bytes < 0 ? "−" : "";
    if (value >= 10 || unit == 0) return formatText("%s%.0f %s", sign, value, units[unit]);
    return formatText("%s%.1f %s", sign, value, units[unit]);
}

std::string withThousands(int64_t value) {
    std::string digits = std::to_string(value < 0 ? -value : value);
    for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<size_t>(i), ",");
    return (value < 0 ? "-" : "") + digits;
}

}  // namespace

std::string describeMemoryModel(const MemoryModel& model) {
    if (model.fixedBytes < 0) {
        return "≈ " + approximate(model.bytesPerSample) + " per sample (" + approximate(model.fixedBytes) +
               " at zero: the smallest sizes need more per sample)";
    }
    return "≈ " + approximate(model.fixedBytes) + " fixed + " + approximate(model.bytesPerSample) + " per sample";
}

WhatIf predictWhatIf(const MemoryModel& model, int64_t microBatch, int64_t targetBatch, int64_t usableBytes,
                     int64_t capacityBytes) {
    WhatIf w;
    w.microBatch = std::max<int64_t>(1, microBatch);
    w.predictedPeakBytes = model.fixedBytes + model.bytesPerSample * static_cast<double>(w.microBatch);
    if (targetBatch > 0) {
        // The rule without its list: a target of 2^31 samples at a micro-batch of 1 is 2^31 sizes.
        w.split = EvenSplit::of(targetBatch, w.microBatch);
        w.accumulationSteps = w.split.parts;
    }
    w.fitsCapacity = w.predictedPeakBytes <= static_cast<double>(capacityBytes);
    w.fitsUsable = w.predictedPeakBytes <= static_cast<double>(usableBytes);
    return w;
}

std::vector<MemoryPart> memoryParts(const MemoryBreakdown& b) {
    std::vector<MemoryPart> parts;
    parts.push_back({"parameters", b.parameterBytes,
                     "The model's weights (and BatchNorm statistics): they stay on the device for the whole run."});
    parts.push_back({"gradients", b.gradientBytes,
                     "One gradient per weight, summed over the micro-batches of a training batch until the optimizer "
                     "step: the same size as the parameters."});
    parts.push_back(
        {b.optimizerStateReserved ? "optimizer state (reserved)" : "optimizer state", b.optimizerStateBytes,
         b.optimizerStateReserved
             ? "Held back for the optimizer's state (Adam keeps two numbers per weight), which it creates at "
               "its first step; reserving it now keeps the probe honest."
             : "What the optimizer remembers between steps: Adam keeps two numbers per weight, SGD with "
               "momentum one, plain SGD none."});
    std::string activations =
        "What one micro-batch needs while it runs: every layer's outputs kept for the backward pass, and "
        "the gradient in flight — each parameter's new gradient, from the moment backward computes it "
        "until it adds it to the gradients above (one parameter's at a time, as in any PyTorch loop). "
        "It grows with the micro-batch size, which is why a smaller micro-batch fits.";
    if (b.memorySavers == "checkpoint" || b.memorySavers == "both") {
        activations +=
            " With activation checkpointing, forward keeps only the input of each part of the model (a residual "
            "block, a convolution stage) and backward runs each part again, one at a time: the bar holds one "
            "part's layer outputs instead of every layer's, for about one more forward pass of time.";
    }
    if (b.memorySavers == "bf16" || b.memorySavers == "both") {
        activations +=
            " Under bfloat16 autocast the convolution and linear layers' outputs take 2 bytes a number instead "
            "of 4 (about 3 significant digits instead of 7).";
    }
    parts.push_back(
        {"activations (micro-batch " + std::to_string(b.activationMicroBatch) + ")", b.activationBytes, activations});
    if (b.inputBytes > 0) {
        parts.push_back({"input batch", b.inputBytes,
                         "The micro-batch's samples and targets, copied to the device for its forward pass."});
    }
    if (b.bufferCopyBytes > 0) {
        parts.push_back({"buffer copies (BatchPilot)", b.bufferCopyBytes,
                         "BatchPilot's copies of the model's buffers (BatchNorm statistics), as the batch and the "
                         "micro-batch found them: an out-of-memory error puts them back, so no sample moves them "
                         "twice."});
    }
    if (b.workspaceBytes > 0) {
        parts.push_back({"cuBLAS workspace", b.workspaceBytes,
                         "Scratch memory cuBLAS takes through PyTorch's allocator at the first matrix product and "
                         "keeps: 8.1 MiB per stream, 32 MiB on compute capability 9.0 and later (H100, H200)."});
    }
    if (b.peakBytes > b.attributedBytes()) {
        // Without it the parts would fall short of the device's memory by that much.
        parts.push_back({"other resident", b.peakBytes - b.attributedBytes(),
                         "Memory in use at the peak that the parts below do not explain: tensors that stayed "
                         "allocated between micro-batches besides the model, its gradients and the optimizer "
                         "state (on a GPU also the allocator's rounding)."});
    }
    const bool cuda = b.device.rfind("cuda", 0) == 0;
    if (b.cacheBytes > 0 || cuda) {
        parts.push_back({"allocator cache", b.cacheBytes,
                         "What the caching allocator (CUDA's, or the virtual GPU's model of it) held at the peak "
                         "beyond the tensors: freed blocks it keeps to reuse, and the unused ends of its rounded "
                         "blocks and segments. Free for this run, not for other processes; fragmentation shows "
                         "here."});
    }
    if (b.otherProcessBytes > 0 || cuda) {
        // The driver cannot tell this process's CUDA context from other programs' memory: both
        // are the GPU's used memory beyond this run's reserved bytes.
        parts.push_back({"CUDA context and other processes", b.otherProcessBytes,
                         "Memory on this GPU outside this run's allocator (total minus free minus reserved): this "
                         "process's CUDA context, kernels and math libraries (measured 0.75 GiB on an H200 with "
                         "CUDA 13 once cuBLAS and cuDNN were loaded) and any other program's memory."});
    }
    if (b.contextBytes > 0) {
        parts.push_back({"CUDA context", b.contextBytes,
                         "What the CUDA driver takes on the device for this process (kernels, their state), outside "
                         "PyTorch's allocator, with the math libraries' own memory. No tensor can use it."});
    }
    parts.push_back({"free", b.freeBytes, "Memory not used even at this run's peak."});
    return parts;
}

void RunDigest::handle(const Event& event) {
    if (const auto* s = std::get_if<RunSummary>(&event)) {
        summary = *s;
    } else if (const auto* started = std::get_if<ProbeStarted>(&event)) {
        probeStarted = *started;
        trials.clear();
        probeFinished.reset();
        timings.clear();
        throughputChosen.reset();
    } else if (const auto* timed = std::get_if<ThroughputTimed>(&event)) {
        if (throughputChosen) {
            // A timing after a decision without a new probe: the throughput drifted and the
            // sizes are timed again (probe.retime_every); the new search replaces the old one.
            timings.clear();
            throughputChosen.reset();
        }
        if (!timings.empty() && timings.back().microBatch == timed->microBatch)
            timings.back() = *timed;
        else if (timings.size() < kMaxTrials)
            timings.push_back(*timed);
    } else if (const auto* chosen = std::get_if<ThroughputChosen>(&event)) {
        throughputChosen = *chosen;
    } else if (const auto* trial = std::get_if<ProbeTrial>(&event)) {
        if (trials.size() < kMaxTrials) trials.push_back(*trial);
    } else if (const auto* finished = std::get_if<ProbeFinished>(&event)) {
        probeFinished = *finished;
    } else if (const auto* b = std::get_if<MemoryBreakdown>(&event)) {
        breakdown = *b;
    } else if (const auto* check = std::get_if<EquivalenceChecked>(&event)) {
        equivalence = *check;
    } else if (const auto* v = std::get_if<ValidationDone>(&event)) {
        validation = *v;
    } else if (const auto* survey = std::get_if<SaverSurvey>(&event)) {
        saverSurvey = *survey;
    } else if (const auto* metrics = std::get_if<StepMetrics>(&event)) {
        lastStep = *metrics;
    } else if (const auto* state = std::get_if<RunStateChanged>(&event)) {
        lastState = *state;
    }
}

void MemoryReport::handle(const Event& event) {
    m_digest.handle(event);
    if (std::holds_alternative<ProbeStarted>(event)) {
        m_probing = true;
    } else if (std::holds_alternative<ProbeFinished>(event)) {
        m_probing = false;
        m_waitingForStep = true;
        // The probe ended inside step m_stepsDone + 1; the step after it is all plan.
        m_reportAfterStep = m_stepsDone + 2;
    } else if (std::holds_alternative<ThroughputTimed>(event)) {
        m_timing = true;
    } else if (std::holds_alternative<ThroughputChosen>(event)) {
        // The report explains the choice: it waits for the first whole step at the chosen size.
        m_timing = false;
        m_reportAfterStep = m_stepsDone + 2;
    } else if (const auto* stepped = std::get_if<OptimizerStepped>(&event)) {
        m_stepsDone = stepped->step;
    } else if (const auto* breakdown = std::get_if<MemoryBreakdown>(&event)) {
        if (m_waitingForStep && !m_probing && !m_timing && breakdown->step >= m_reportAfterStep) {
            m_waitingForStep = false;
            m_due = true;
        }
    } else if (const auto* state = std::get_if<RunStateChanged>(&event)) {
        const bool ended = state->state == RunState::Finished || state->state == RunState::Failed;
        if (ended && m_waitingForStep && m_digest.breakdown && m_digest.breakdown->step > 0) {
            m_waitingForStep = false;
            m_due = true;
        }
    }
}

std::string MemoryReport::take() {
    m_due = false;
    return text();
}

namespace {

std::string planLine(const char* what, int64_t microBatch, int64_t target) {
    const EvenSplit split = EvenSplit::of(target, std::max<int64_t>(1, microBatch));
    std::string line = formatText("%s %" PRId64 ": target %" PRId64 " = %" PRId64 " micro-batch(es) of %" PRId64, what,
                                  microBatch, target, split.parts, split.sizeOf(0));
    if (split.larger > 0) line += formatText(" or %" PRId64, split.base);
    return line + "\n";
}

/// The fastest-micro-batch search: each size's throughput, and why the choice is not the largest.
std::string timingText(const RunDigest& d) {
    std::string out;
    if (d.throughputChosen) {
        out += formatText("Fastest micro-batch, timed on %d training micro-batches in %.2f s (all of them trained):\n",
                          d.throughputChosen->microBatchesTimed, d.throughputChosen->seconds);
    } else {
        out += "Fastest micro-batch: still timing (on training micro-batches)\n";
    }
    out += "  micro-batch   samples/s  timings\n";
    for (const ThroughputTimed& t : d.timings) {
        const bool chosen = d.throughputChosen && d.throughputChosen->microBatch == t.microBatch;
        out += formatText("  %11" PRId64 "  %10.0f  %7d%s\n", t.microBatch, t.samplesPerSecond, t.repetitions,
                          chosen ? "  <- chosen" : "");
    }
    if (d.throughputChosen) {
        const ThroughputChosen& c = *d.throughputChosen;
        out += planLine("Chosen micro-batch", c.microBatch, c.targetBatch);
        if (c.microBatch != c.largestMicroBatch) {
            out += formatText("  Not the largest that fits (%" PRId64 "): %s\n", c.largestMicroBatch, c.reason.c_str());
        } else {
            out += "  " + c.reason + "\n";
        }
    }
    return out + "\n";
}

}  // namespace

std::string describeSaverSurvey(const SaverSurvey& survey) {
    std::string out = formatText("Memory savers on %s (%s usable, target batch %" PRId64
                                 "), measured in %.1f s after step %" PRId64 ": %s\n",
                                 survey.device.c_str(), formatBytes(survey.usableBytes).c_str(), survey.targetBatch,
                                 survey.seconds, survey.step, survey.reason.c_str());
    const SaverOption* inUse = findOption(survey, survey.current);
    const double now = inUse != nullptr ? inUse->samplesPerSecond : 0;
    out += "  savers            micro-batch  accumulation  samples/s  vs now        peak  memory line\n";
    for (const SaverOption& o : survey.options) {
        const std::string name = o.savers + (o.savers == survey.current ? " (in use)" : "");
        if (!o.unavailable.empty()) {
            out += formatText("  %-16s  not available: %s\n", name.c_str(), o.unavailable.c_str());
            continue;
        }
        if (!o.fits) {
            out += formatText("  %-16s  does not fit even at the smallest micro-batch\n", name.c_str());
            continue;
        }
        const std::string ratio = now > 0 ? formatText("%.2f×", o.samplesPerSecond / now) : std::string("-");
        const std::string line = o.bytesPerSample > 0 ? describeMemoryModel(MemoryModel{o.fixedBytes, o.bytesPerSample})
                                                      : std::string("one size measured");
        out += formatText("  %-16s  %11" PRId64 "  %12" PRId64 "  %9.1f  %6s  %10s  %s\n", name.c_str(), o.microBatch,
                          o.accumulationSteps, o.samplesPerSecond, ratio.c_str(), formatBytes(o.peakBytes).c_str(),
                          line.c_str());
    }
    const bool anyFits = std::any_of(survey.options.begin(), survey.options.end(),
                                     [](const SaverOption& o) { return o.fits && o.unavailable.empty(); });
    out += "  " +
           (!anyFits                    ? std::string("no memory saver makes the smallest micro-batch fit")
            : survey.suggestion.empty() ? std::string("keep the savers in use")
                                        : "suggested: --memory-savers " + survey.suggestion) +
           " (samples/s timed once per saver, forward and backward, on the data's first samples)\n";
    return out;
}

std::string MemoryReport::text() const {
    const RunDigest& d = m_digest;
    const ProbeStarted started = d.probeStarted.value_or(ProbeStarted{});
    std::string out = "Memory report";
    if (d.summary) {
        out += " — " + d.summary->model + " (" + withThousands(d.summary->parameterCount) + " parameters) on " +
               d.summary->device + ", target batch " + std::to_string(d.summary->targetBatch);
    }
    out += "\n\n";
    if (d.probeFinished || !d.trials.empty()) {
        out += formatText("Probe %d (%s): %zu trial(s), usable %s of the device (capacity minus headroom)\n",
                          started.sequence, toString(started.reason), d.trials.size(),
                          formatBytes(started.usableBytes).c_str());
        out += "  trial  micro-batch  result                    peak\n";
        for (const ProbeTrial& t : d.trials) {
            const char* result = t.fit ? (t.withinHeadroom ? "fits" : "fits, past headroom") : "out of memory";
            std::string peak =
                t.fit ? formatBytes(t.peakBytes)
                      : (t.failedAllocationBytes > 0 ? "failed to get " + formatBytes(t.failedAllocationBytes)
                                                     : std::string("-"));
            out += formatText("  %5d  %11" PRId64 "  %-20s  %10s\n", t.trial, t.microBatch, result, peak.c_str());
        }
    }
    if (d.probeFinished) {
        const ProbeFinished& finished = *d.probeFinished;
        if (finished.bytesPerSample > 0) {
            const MemoryModel model{finished.fixedBytes, finished.bytesPerSample};
            out += "Memory model: " + describeMemoryModel(model) + "\n";
            if (d.breakdown && d.breakdown->largestGradientBytes > 0) {
                const MemoryBreakdown& b = *d.breakdown;
                out += formatText(
                    "  fixed: parameters, gradients and optimizer state (%s), and during backward the "
                    "gradient in flight (up to %s, the largest parameter's)\n",
                    formatBytes(b.parameterBytes + b.gradientBytes + b.optimizerStateBytes).c_str(),
                    formatBytes(b.largestGradientBytes).c_str());
            }
            out += formatText("  predicts %" PRId64 " samples at most within the usable %s\n",
                              model.largestWithin(started.usableBytes), formatBytes(started.usableBytes).c_str());
        } else {
            out += "Memory model: not fitted (fewer than two sizes fit)\n";
        }
        const bool timed = !d.timings.empty() || d.throughputChosen;
        out += planLine(timed ? "Largest that fits" : "Chosen micro-batch", finished.microBatch, finished.targetBatch);
        if (!timed) out += "\n";
    }
    if (!d.timings.empty() || d.throughputChosen) out += timingText(d);
    if (d.breakdown) {
        const MemoryBreakdown& b = *d.breakdown;
        out += formatText("Where the memory goes on %s after step %" PRId64 " (peak of a %" PRId64
                          "-sample micro-batch)\n",
                          b.device.c_str(), b.step, b.activationMicroBatch);
        out += "  part                              MiB    share\n";
        const double total = static_cast<double>(std::max<int64_t>(1, b.totalBytes));
        for (const MemoryPart& part : memoryParts(b)) {
            out += formatText("  %-30s %8.2f  %6.1f%%\n", part.name.c_str(), toMiB(part.bytes),
                              100.0 * static_cast<double>(part.bytes) / total);
        }
        out += formatText("  %-30s %8.2f  %6.1f%%\n", "total", toMiB(b.totalBytes), 100.0);
        const double explained =
            b.peakBytes > 0 ? 100.0 * static_cast<double>(b.attributedBytes()) / static_cast<double>(b.peakBytes) : 0.0;
        // "other resident" is the part nothing names: the share says how much of the peak is named.
        out += formatText("  measured peak %.2f MiB; the named parts above explain %.2f MiB of it (%.1f%%)%s\n",
                          toMiB(b.peakBytes), toMiB(b.attributedBytes()), explained,
                          b.peakBytes > b.attributedBytes() ? ", other resident is the rest" : "");
    }
    if (d.saverSurvey) out += describeSaverSurvey(*d.saverSurvey);
    if (d.validation && d.validation->microBatch > 0) {
        const ValidationDone& v = *d.validation;
        const int64_t training = d.lastStep ? d.lastStep->microBatch : 0;
        out += formatText("Validation after step %" PRId64 ": %" PRId64
                          " held-out samples in micro-batches of up to %" PRId64,
                          v.step, v.samples, v.microBatch);
        if (training > 0) out += formatText(" (training's: %" PRId64 ")", training);
        out += ": without gradients nothing is kept for a backward pass, so a larger micro-batch fits";
        if (v.ooms > 0) out += formatText("; %d out-of-memory error(s) halved it", v.ooms);
        out += "\n";
    }
    return out;
}

}  // namespace batchpilot::core
