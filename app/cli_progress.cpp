#include "app/cli_progress.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>

#include "core/plan/accumulation_plan.h"
#include "core/base/byte_size.h"
#include "core/events/event_json.h"
#include "core/memory/caching_allocator.h"
#include "core/config/device_spec.h"
#include "core/config/memory_savers.h"
#include "core/base/text_format.h"
#include "core/train/trainer.h"

namespace batchpilot::app {
using namespace core;  // this file prints core's events
namespace {

std::string duration(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) return "?";
    const auto total = static_cast<int64_t>(seconds + 0.5);
    if (total >= 3600) return formatText("%" PRId64 "h%02" PRId64 "m", total / 3600, total % 3600 / 60);
    if (total >= 60) return formatText("%" PRId64 "m%02" PRId64 "s", total / 60, total % 60);
    return formatText("%" PRId64 "s", total);
}

/// "loss 0.2113, accuracy 93.1%, top-5 99.4%" with the metrics that apply.
std::string validationMetrics(const core::ValidationDone& e) {
    std::string text = formatText("loss %.4f", e.loss);
    if (e.accuracy >= 0) text += formatText(", accuracy %.1f%%", 100.0 * e.accuracy);
    if (e.top5Accuracy >= 0) text += formatText(", top-5 %.1f%%", 100.0 * e.top5Accuracy);
    if (e.meanSquaredError >= 0) text += formatText(", MSE %.4g", e.meanSquaredError);
    if (e.meanAbsoluteError >= 0) text += formatText(", MAE %.4g", e.meanAbsoluteError);
    return text;
}

/// "OOM in forward at micro-batch 64 (2.0 MiB requested): recovered, continuing at 32", for
/// this process's OOMs and those another rank reported; `expandableSegments`: the device's
/// allocator runs with them (its remedy is then the size only).
std::string oomText(const core::OomEvent& e, bool expandableSegments = false) {
    // newMicroBatch 0: the probe is still searching and chooses the next size itself.
    const std::string outcome = !e.recovered          ? "not recovered"
                                : e.newMicroBatch > 0 ? "recovered, continuing at " + std::to_string(e.newMicroBatch)
                                                      : "recovered; the probe tries a smaller size";
    std::string text = formatText("OOM in %s at micro-batch %" PRId64 " (%s requested): %s", core::toString(e.phase),
                                  e.microBatch, core::formatBytes(e.requestedBytes).c_str(), outcome.c_str());
    if (const auto numbers = core::parseCudaOutOfMemoryText(e.message)) {
        text += " — " + core::describeCudaOom(*numbers, expandableSegments);
    }
    if (e.redoneSamples > 0) {
        text += formatText("; the batch starts over, its first %" PRId64
                           " samples trained again (backward had added part of the failed micro-batch "
                           "to the accumulated gradients)",
                           e.redoneSamples);
    }
    if (!e.snapshotFile.empty())
        text += "; memory snapshot " + e.snapshotFile + " (open it at https://pytorch.org/memory_viz)";
    return text;
}

/// Whether `a` is a better validation result than `b`: by `metric` when the run keeps its best
/// model by one (the summary then names the same pass as the kept model), else higher accuracy,
/// or lower loss.
bool better(const core::ValidationDone& a, const core::ValidationDone& b, const std::string& metric) {
    if (!metric.empty()) {
        const auto x = core::validationMetric(a, metric);
        const auto y = core::validationMetric(b, metric);
        if (x && y) {
            if (!std::isfinite(*y)) return std::isfinite(*x);  // a NaN pass is beaten by any finite one
            return std::isfinite(*x) && core::improves(metric, *x, *y);
        }
    }
    if (a.accuracy >= 0 && b.accuracy >= 0 && a.accuracy != b.accuracy) return a.accuracy > b.accuracy;
    return a.loss < b.loss;
}

}  // namespace

std::string ConsoleReporter::lastValidationShort() const {
    if (!m_lastValidation) return {};
    if (m_lastValidation->accuracy >= 0) return formatText("  val acc %.1f%%", 100.0 * m_lastValidation->accuracy);
    return formatText("  val loss %.4f", m_lastValidation->loss);
}

std::string ConsoleReporter::validationSummary() const {
    if (!m_lastValidation) return {};
    std::string text =
        "validation: " + validationMetrics(*m_lastValidation) + " after step " + std::to_string(m_lastValidation->step);
    if (m_bestValidation && m_bestValidation->step != m_lastValidation->step) {
        text +=
            "; best " + validationMetrics(*m_bestValidation) + " after step " + std::to_string(m_bestValidation->step);
    }
    if (m_bestCheckpoint) {
        text += formatText("\nbest model by %s (%.4f, step %" PRId64 "): %s", m_bestCheckpoint->metric.c_str(),
                           m_bestCheckpoint->value, m_bestCheckpoint->step, m_bestCheckpoint->path.c_str());
    }
    return text;
}

ConsoleReporter::ConsoleReporter(std::FILE* out, bool interactive, bool quiet)
    : m_out(out), m_interactive(interactive), m_quiet(quiet) {}

bool ConsoleReporter::openEvents(const std::string& path, std::string& error) {
    m_events.open(path, std::ios::out | std::ios::trunc);
    if (!m_events) {
        error = "cannot write the events file \"" + path + "\": check the folder exists and is writable";
        return false;
    }
    m_eventsPath = path;
    return true;
}

std::string ConsoleReporter::closeEvents() {
    if (m_events.is_open()) {
        m_events.flush();
        if (!m_events && m_eventsError.empty())
            m_eventsError = "writing the events file \"" + m_eventsPath + "\" failed (disk full?)";
        m_events.close();
        if (m_events.fail() && m_eventsError.empty())
            m_eventsError = "closing the events file \"" + m_eventsPath + "\" failed (disk full?)";
    }
    return m_eventsError;
}

std::string ConsoleReporter::batchName() const {
    return m_rank < 0 ? "target batch" : "rank " + std::to_string(m_rank) + "'s share";
}

void ConsoleReporter::line(const std::string& text) {
    if (m_quiet) return;
    if (m_openLine) std::fputc('\n', m_out);
    m_openLine = false;
    std::fprintf(m_out, "%s\n", text.c_str());
    std::fflush(m_out);
}

void ConsoleReporter::onEvent(const core::Event& event) {
    if (m_events.is_open() && m_eventsError.empty()) {
        m_events << toJsonLine(event) << '\n';
        // Each step is pushed to the file, so that a write error shows while the run goes on.
        if (std::holds_alternative<StepMetrics>(event)) m_events.flush();
        if (!m_events) {
            m_eventsError = "writing the events file \"" + m_eventsPath +
                            "\" failed (disk full?); the run goes on, "
                            "but its events from here on are lost";
            std::fprintf(stderr, "\nbatchpilot-cli: error: %s\n", m_eventsError.c_str());
        }
    }
    if (m_memoryReport) {
        m_report.handle(event);
        if (m_report.reportDue()) {
            // The report is printed even with --quiet: the user asked for it.
            if (m_openLine) std::fputc('\n', m_out);
            m_openLine = false;
            std::fprintf(m_out, "\n%s\n", m_report.take().c_str());
            std::fflush(m_out);
        }
    }
    std::visit([this](const auto& e) { on(e); }, event);
}

void ConsoleReporter::on(const core::OptimizerStepped&) {
    if (m_checkSamples >= 0 && !m_checkSent && m_trainer) {
        m_checkSent = true;
        m_trainer->checkEquivalence(m_checkSamples);
    }
}

void ConsoleReporter::on(const core::EquivalenceChecked& e) {
    m_equivalence = e;
    m_haveEquivalence = true;
    printEquivalence(e);
}

void ConsoleReporter::on(const core::RunStateChanged& e) {
    if (e.state == RunState::Starting) {
        line(e.detail.rfind("resumed", 0) == 0 ? e.detail : "starting on " + e.detail);
    }
    if (e.state == RunState::Paused) line("paused");
}

void ConsoleReporter::on(const core::ProbeStarted& e) {
    // The device trained on from here (a probe starts on every device switch).
    const auto device = core::parseDeviceName(e.device);
    m_expandableSegments = device && core::expandableSegmentsOn(*device);
    line(formatText(
        "probe #%d (%s) on %s: up to %" PRId64 " samples, usable memory %s%s", e.sequence, toString(e.reason),
        e.device.c_str(), e.upperBound, formatBytes(e.usableBytes).c_str(),
        e.reservedBytes > 0 ? (", holding " + formatBytes(e.reservedBytes) + " for optimizer state").c_str() : ""));
}

void ConsoleReporter::on(const core::ProbeTrial& e) {
    line(formatText("  trial %2d: micro-batch %6" PRId64 "  %-4s peak %9.1f MiB%s", e.trial, e.microBatch,
                    e.fit ? "fit" : "OOM", toMiB(e.peakBytes),
                    e.fit && !e.withinHeadroom ? "  (over the headroom line)" : ""));
}

void ConsoleReporter::on(const core::ProbeFinished& e) {
    std::string model;
    if (e.bytesPerSample > 0) {
        model = formatText("; memory ≈ %.1f MiB + %.3f MiB per sample", e.fixedBytes / 1048576.0,
                           e.bytesPerSample / 1048576.0);
    }
    line(formatText("probe #%d done in %d trials, %.2f s: micro-batch %" PRId64 "; %s %" PRId64 " = %s accumulated%s",
                    e.sequence, e.trials, e.seconds, e.microBatch, batchName().c_str(), e.targetBatch,
                    EvenSplit::of(e.targetBatch, e.microBatch).sum().c_str(), model.c_str()));
    if (!m_gpuTargets.empty() && e.bytesPerSample > 0 && m_rank <= 0) {
        // Printed even with --quiet: the user asked for it.
        if (m_openLine) std::fputc('\n', m_out);
        m_openLine = false;
        const auto rows =
            planForGpus(m_gpuTargets, e.fixedBytes, e.bytesPerSample, m_gpuWorkspace, e.targetBatch, m_gpuHeadroom);
        std::fprintf(m_out, "%s", formatGpuPlan(rows, m_gpuDevice, e.targetBatch).c_str());
        std::fflush(m_out);
        m_gpuTargets.clear();
    }
}

void ConsoleReporter::on(const core::ThroughputTimed& e) {
    // One line per candidate once it is ranked would hide the repetitions; one per
    // counted timing shows the search working without the warm-ups' noise.
    if (e.repetitions > 0) {
        line(formatText("  timed micro-batch %6" PRId64 ": %9.0f samples/s (median of %d)", e.microBatch,
                        e.samplesPerSecond, e.repetitions));
    }
}

void ConsoleReporter::on(const core::ThroughputChecked& e) {
    // The check on whole batches can take a minute: each turn shows how far the gain is known.
    line(formatText("  whole batches of %6" PRId64 " and %" PRId64
                    ", turn %2d: %.3fx (median %.3fx, 95%% %.3fx to %.3fx)",
                    e.microBatch, e.largestMicroBatch, e.turn, e.ratio, e.gain, e.gainLow, e.gainHigh));
}

void ConsoleReporter::on(const core::ThroughputChosen& e) {
    line(formatText("fastest micro-batch: %" PRId64 "; %s %" PRId64
                    " = %s accumulated, after %d timed micro-batches, %.2f s (all of them trained): %s",
                    e.microBatch, batchName().c_str(), e.targetBatch,
                    EvenSplit::of(e.targetBatch, e.microBatch).sum().c_str(), e.microBatchesTimed, e.seconds,
                    e.reason.c_str()));
}

void ConsoleReporter::on(const core::OomEvent& e) {
    ++m_ooms;
    line("  " + oomText(e, m_expandableSegments));
}

void ConsoleReporter::on(const core::MicroBatchDone& e) {
    // What this process trained in the step, micro-batch by micro-batch (index 0 starts
    // a batch, or a batch trained again after a float16 overflow).
    if (e.index == 0 || e.step != m_stepTrained.step) m_stepTrained = {e.step, 0, 0, 0};
    ++m_stepTrained.microBatches;
    m_stepTrained.samples += e.size;
    m_stepTrained.largest = std::max(m_stepTrained.largest, e.size);
}

void ConsoleReporter::on(const core::StepMetrics& e) {
    m_lastStep = e;
    if (m_quiet) return;
    // The micro-batches that ran: "256 × 4", or "≤132 × 12" where they differed (probe
    // trials, timed sizes, an OOM, sizes that differ by one).
    std::string microBatches = formatText("%" PRId64 " × %" PRId64, e.microBatch, e.accumulationSteps);
    if (m_stepTrained.step == e.step && m_stepTrained.microBatches > 0) {
        const StepTrained& t = m_stepTrained;
        microBatches = formatText("%s%" PRId64 " × %" PRId64, t.largest * t.microBatches == t.samples ? "" : "≤",
                                  t.largest, t.microBatches);
    }
    const double eta = e.totalSteps > 0 && e.step > 0
                           ? e.time / static_cast<double>(e.step) * static_cast<double>(e.totalSteps - e.step)
                           : NAN;
    const std::string text =
        formatText("step %" PRId64 "/%" PRId64 "  epoch %" PRId64
                   "  loss %.4f%s  %.1f samples/s  micro-batch %s"
                   "  peak %.1f MiB  ETA %s",
                   e.step, e.totalSteps, e.epoch, e.loss, lastValidationShort().c_str(), e.samplesPerSecond,
                   microBatches.c_str(), toMiB(e.peakBytes), duration(eta).c_str()) +
        m_ranksText;
    if (m_interactive) {
        std::fprintf(m_out, "\r\033[K%s", text.c_str());
        m_openLine = true;
        std::fflush(m_out);
    } else {
        line(text);
    }
}

void ConsoleReporter::on(const core::RanksStepped& e) {
    // Several devices: every rank's share, micro-batch and wait, on the step's line
    // (the StepMetrics that follows); share changes on lines of their own.
    m_ranksText = m_interactive ? "  ranks:" : "\n  ranks:";  // the live line stays one line
    for (const RankStep& r : e.ranks) {
        m_ranksText +=
            formatText(" %s%d %s %" PRId64 " in %" PRId64 "×≤%" PRId64 " %.0f/s wait %.2fs%s", r.rank > 0 ? "| " : "",
                       r.rank, r.device.c_str(), r.share, r.microBatches, r.microBatch, r.samplesPerSecond,
                       r.waitSeconds, r.ooms > 0 ? formatText(" %d OOM", r.ooms).c_str() : "");
    }
    m_ranksText += formatText("  all-reduce %.1f ms", e.allReduceSeconds * 1000);
    const std::string summedBy =
        e.collectives + (e.collectivesWhy.empty() ? std::string() : " (" + e.collectivesWhy + ")");
    if (summedBy != m_summedBy) {
        m_summedBy = summedBy;
        line("gradients summed by " + summedBy);
    }
    if (!e.nextShares.empty()) {
        std::string shares;
        for (const int64_t share : e.nextShares) shares += (shares.empty() ? "" : " + ") + std::to_string(share);
        line(formatText("shares from step %" PRId64 " on: %s (%s)", e.step + 1, shares.c_str(), e.shareReason.c_str()));
    }
}

void ConsoleReporter::on(const core::RankProbed& e) {
    // Several devices: another rank's probes and OOMs, a line each, named by the rank.
    const std::string who = formatText("rank %d (%s): ", e.rank, e.device.c_str());
    for (const ProbeStarted& p : e.probes) {
        line(formatText("%sprobe #%d (%s): up to %" PRId64 " samples, usable memory %s", who.c_str(), p.sequence,
                        toString(p.reason), p.upperBound, formatBytes(p.usableBytes).c_str()));
    }
    if (!e.trials.empty()) {
        std::string trials;
        for (const ProbeTrial& t : e.trials)
            trials += formatText("%s%" PRId64 " %s", trials.empty() ? "" : ", ", t.microBatch,
                                 !t.fit             ? "OOM"
                                 : t.withinHeadroom ? "fit"
                                                    : "fit over the headroom line");
        line(who + "tried " + trials);
    }
    for (const ProbeFinished& f : e.finished) {
        line(formatText("%sprobe #%d done in %d trials: micro-batch %" PRId64 "; its share %" PRId64
                        " = %s accumulated",
                        who.c_str(), f.sequence, f.trials, f.microBatch, f.targetBatch,
                        EvenSplit::of(f.targetBatch, f.microBatch).sum().c_str()));
    }
    for (const OomEvent& o : e.ooms) {
        ++m_otherRankOoms;
        line(who + oomText(o));
    }
}

void ConsoleReporter::on(const core::ValidationDone& e) {
    m_lastValidation = e;
    if (!m_bestValidation || better(e, *m_bestValidation, m_keepBest)) m_bestValidation = e;
    line(formatText("validation after step %" PRId64 ": %s on %" PRId64 " held-out samples (micro-batch %" PRId64
                    ", %.2f s%s)",
                    e.step, validationMetrics(e).c_str(), e.samples, e.microBatch, e.seconds,
                    e.ooms > 0 ? formatText(", %d OOM(s) recovered", e.ooms).c_str() : ""));
}

void ConsoleReporter::on(const core::TargetBatchChanged& e) {
    line(formatText("target batch %" PRId64 " → %" PRId64 ", learning rate %g → %g", e.oldTarget, e.newTarget,
                    e.oldLearningRate, e.newLearningRate));
}

void ConsoleReporter::on(const core::DeviceSwitched& e) {
    line((e.rank > 0 ? "rank " + std::to_string(e.rank) + ": device " : std::string("device ")) + e.from + " → " +
         e.to);
}

void ConsoleReporter::on(const core::SaverSurvey& e) {
    std::string table = describeSaverSurvey(e);
    if (!table.empty() && table.back() == '\n') table.pop_back();
    line(table);
}

void ConsoleReporter::on(const core::MemorySaversChanged& e) {
    line("memory savers " + e.from + " → " + e.to +
         (e.predictedMicroBatch > 0 ? " (predicted micro-batch " + std::to_string(e.predictedMicroBatch) + ")"
                                    : std::string()) +
         ": " + e.why);
}

void ConsoleReporter::on(const core::LossScaleChanged& e) {
    if (e.overflow) {
        line(formatText("step %" PRId64 ": float16 gradients overflowed at loss scale %g: no step taken, "
                        "the batch's %" PRId64 " samples are trained again at %g",
                        e.step, e.from, e.redoneSamples, e.to));
    } else {
        line(formatText("loss scale %g → %g after %" PRId64 " steps without a float16 overflow", e.from, e.to,
                        core::kLossScaleGrowthSteps));
    }
}

void ConsoleReporter::on(const core::CheckpointSaved& e) {
    if (!e.metric.empty()) {
        m_bestCheckpoint = e;
        line(formatText("best model so far (%s %.4f) saved at step %" PRId64 ": %s", e.metric.c_str(), e.value, e.step,
                        e.path.c_str()));
    } else if (!m_interactive) {
        line("checkpoint saved at step " + std::to_string(e.step) + ": " + e.path);
    }
}

void ConsoleReporter::on(const core::Warning& e) {
    line("warning: " + e.message);
}

void ConsoleReporter::on(const core::ErrorEvent& e) {
    line("error (" + e.where + "): " + e.message);
}

void ConsoleReporter::printEquivalence(const core::EquivalenceChecked& r) {
    if (m_openLine) std::fputc('\n', m_out);
    m_openLine = false;
    if (!r.error.empty()) {
        std::fprintf(m_out, "equivalence check: %s\n", r.error.c_str());
        std::fflush(m_out);
        return;
    }
    const std::string sizes = core::describeSplit(r);
    std::fprintf(
        m_out, "\nEquivalence check after step %" PRId64 ": %" PRId64 " samples accumulated as %s, against one pass\n",
        r.step, r.samples, sizes.c_str());
    std::fprintf(m_out, "  %-32s %10s  %12s  %12s  %14s\n", "parameter tensor", "elements", "max |diff|", "relative",
                 "cosine");
    auto row = [&](const core::TensorDifference& d) {
        std::fprintf(m_out, "  %-32s %10" PRId64 "  %12.3g  %12.3g  %14.10f\n", d.name.c_str(), d.elements,
                     d.maxAbsDifference, d.relativeDifference, d.cosineSimilarity);
    };
    for (const auto& d : r.tensors) row(d);
    row(r.overall);
    std::fprintf(m_out, "%s\n\n", r.explanation.c_str());
    std::fflush(m_out);
}

}  // namespace batchpilot::app
