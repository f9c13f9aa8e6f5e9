#include "ui/session/event_text.h"

#include <QCoreApplication>
#include <QLocale>

#include "core/plan/accumulation_plan.h"
#include "core/base/byte_size.h"
#include "core/config/memory_savers.h"
#include "ui/style/text.h"

namespace batchpilot::ui {

namespace {

QString tr(const char* text) {
    return QCoreApplication::translate("EventText", text);
}

QString bytes(qint64 value) {
    return QString::fromStdString(core::formatBytes(value));
}

QString latin(const char* text) {
    return QString::fromLatin1(text);
}

template <class... Ts>
struct Overloaded : Ts... {
    using Ts::operator()...;
};
// Clang 14 (the sanitizer builds) does not deduce an aggregate's template arguments by itself.
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace

bool isLogged(const core::Event& event) {
    // Several devices: every step has one; the log keeps those that change the shares.
    if (const auto* ranks = std::get_if<core::RanksStepped>(&event)) return !ranks->nextShares.empty();
    return !std::holds_alternative<core::MemorySample>(event) && !std::holds_alternative<core::MicroBatchDone>(event) &&
           !std::holds_alternative<core::OptimizerStepped>(event) &&
           !std::holds_alternative<core::StepMetrics>(event) && !std::holds_alternative<core::MemoryBreakdown>(event) &&
           // The segments after a step are for the Segments tab; those at an OOM say why it failed.
           !(std::holds_alternative<core::AllocatorSegments>(event) && !std::get<core::AllocatorSegments>(event).atOom);
}

EventRow describeEvent(const core::Event& event) {
    return std::visit(
        Overloaded{
            [](const core::RunStateChanged& e) {
                QString details = latin(core::toString(e.state));
                if (!e.detail.empty()) details += QStringLiteral(": ") + str(e.detail);
                return EventRow{e.time, tr("state"), details, e.state == core::RunState::Failed};
            },
            [](const core::ProbeStarted& e) {
                return EventRow{e.time, tr("probe started"),
                                tr("probe %1 (%2) on %3: up to %4 samples, usable %5, "
                                   "optimizer state reserved %6")
                                    .arg(e.sequence)
                                    .arg(latin(core::toString(e.reason)), str(e.device))
                                    .arg(e.upperBound)
                                    .arg(bytes(e.usableBytes), bytes(e.reservedBytes)),
                                false};
            },
            [](const core::ProbeTrial& e) {
                QString result =
                    e.fit ? (e.withinHeadroom ? tr("fits") : tr("fits, past headroom")) : tr("out of memory");
                QString details = tr("probe %1 trial %2: micro-batch %3 %4, peak %5")
                                      .arg(e.sequence)
                                      .arg(e.trial)
                                      .arg(e.microBatch)
                                      .arg(result, bytes(e.peakBytes));
                if (!e.fit && e.failedAllocationBytes > 0)
                    details += tr(", failed allocation %1").arg(bytes(e.failedAllocationBytes));
                details += tr(" (%1 s)").arg(e.seconds, 0, 'f', 3);
                return EventRow{e.time, tr("probe trial"), details, !e.fit};
            },
            [](const core::ProbeFinished& e) {
                QString details = tr("probe %1 chose micro-batch %2 after %3 trials in %4 s: %5")
                                      .arg(e.sequence)
                                      .arg(e.microBatch)
                                      .arg(e.trials)
                                      .arg(e.seconds, 0, 'f', 2)
                                      .arg(planCaption(e.targetBatch, e.microBatch));
                if (e.bytesPerSample > 0)
                    details += tr("; memory ≈ %1 + %2 per sample")
                                   .arg(bytes(static_cast<qint64>(e.fixedBytes)),
                                        bytes(static_cast<qint64>(e.bytesPerSample)));
                if (e.hitTrialLimit) details += tr(" (trial limit reached)");
                return EventRow{e.time, tr("probe finished"), details, false};
            },
            [](const core::OomEvent& e) {
                QString details =
                    tr("step %1, %2, micro-batch %3").arg(e.step).arg(latin(core::toString(e.phase))).arg(e.microBatch);
                if (e.requestedBytes > 0) details += tr(", requested %1").arg(bytes(e.requestedBytes));
                details += e.recovered ? tr(" → replayed the batch at micro-batch %1").arg(e.newMicroBatch)
                                       : tr(" → not recovered");
                if (!e.message.empty())
                    details += QStringLiteral(" — ") + str(e.message).section(QLatin1Char('\n'), 0, 0);
                if (!e.snapshotFile.empty())
                    details += tr("; memory snapshot %1 in the run folder (opens at pytorch.org/memory_viz)")
                                   .arg(str(e.snapshotFile));
                return EventRow{e.time, tr("OOM"), details, true};
            },
            [](const core::MemorySample& e) {
                return EventRow{e.time, tr("memory"),
                                tr("allocated %1, peak %2 of %3")
                                    .arg(bytes(e.allocatedBytes), bytes(e.peakBytes), bytes(e.capacityBytes)),
                                false};
            },
            [](const core::StepMetrics& e) {
                return EventRow{e.time, tr("step"), tr("step %1: loss %2").arg(e.step).arg(e.loss, 0, 'g', 4), false};
            },
            [](const core::MicroBatchDone& e) {
                return EventRow{e.time, tr("micro-batch"),
                                tr("step %1 micro-batch %2: %3 samples").arg(e.step).arg(e.index).arg(e.size), false};
            },
            [](const core::OptimizerStepped& e) {
                return EventRow{e.time, tr("optimizer step"),
                                tr("step %1 after %2 micro-batches").arg(e.step).arg(e.microBatches), false};
            },
            [](const core::TargetBatchChanged& e) {
                QString details = tr("target batch %1 → %2").arg(e.oldTarget).arg(e.newTarget);
                if (e.newLearningRate != e.oldLearningRate)
                    details += tr(", learning rate %1 → %2")
                                   .arg(e.oldLearningRate, 0, 'g', 4)
                                   .arg(e.newLearningRate, 0, 'g', 4);
                return EventRow{e.time, tr("target batch"), details, false};
            },
            [](const core::DeviceSwitched& e) {
                const QString moved = tr("%1 → %2").arg(str(e.from), str(e.to));
                return EventRow{e.time, tr("device switch"),
                                e.rank == 0 ? moved : tr("rank %1: %2").arg(e.rank).arg(moved), false};
            },
            [](const core::Warning& e) {
                return EventRow{e.time, tr("warning"), str(e.message), true};
            },
            [](const core::CheckpointSaved& e) {
                if (!e.metric.empty()) {
                    return EventRow{e.time, tr("checkpoint"),
                                    tr("best model so far (%1 %2) at step %3 saved to %4")
                                        .arg(str(e.metric))
                                        .arg(e.value, 0, 'f', 4)
                                        .arg(e.step)
                                        .arg(str(e.path)),
                                    false};
                }
                return EventRow{e.time, tr("checkpoint"), tr("step %1 saved to %2").arg(e.step).arg(str(e.path)),
                                false};
            },
            [](const core::ErrorEvent& e) {
                QString details = str(e.message);
                if (!e.where.empty()) details += tr(" (%1)").arg(str(e.where));
                return EventRow{e.time, tr("error"), details, true};
            },
            [](const core::RunSummary& e) {
                return EventRow{
                    e.time, tr("run"),
                    tr("%1 (%2 parameters) on %3, %4 (%5 samples), %6, %7 loss")
                        .arg(str(e.model), QLocale().toString(e.parameterCount), str(e.device), str(e.dataset),
                             QLocale().toString(e.datasetSize), str(e.optimizer), str(e.loss)),
                    false};
            },
            [](const core::MemoryBreakdown& e) {
                return EventRow{e.time, tr("memory breakdown"),
                                tr("step %1: parameters %2, gradients %3, optimizer state %4, "
                                   "activations %5 and input %6 (micro-batch %7), peak %8 of %9")
                                    .arg(e.step)
                                    .arg(bytes(e.parameterBytes), bytes(e.gradientBytes), bytes(e.optimizerStateBytes),
                                         bytes(e.activationBytes), bytes(e.inputBytes))
                                    .arg(e.activationMicroBatch)
                                    .arg(bytes(e.peakBytes), bytes(e.totalBytes)),
                                false};
            },
            [](const core::AllocatorSegments& e) {
                QString details = tr("step %1: %2 reserved in %3 segments, %4 of it allocated, limit %5")
                                      .arg(e.step)
                                      .arg(bytes(e.reservedBytes()))
                                      .arg(e.segments.size())
                                      .arg(bytes(e.allocatedBytes()), bytes(e.limitBytes));
                if (e.atOom) {
                    details +=
                        e.fragmentation
                            ? tr(" — fragmentation: no cached block or new segment held the %1 segment tried "
                                 "(largest cached block %2)")
                                  .arg(bytes(e.segmentBytes), bytes(e.largestFreeBlock))
                            : tr(" — exhaustion: no room left for the %1 segment tried").arg(bytes(e.segmentBytes));
                }
                return EventRow{e.time, e.atOom ? tr("segments at OOM") : tr("segments"), details, e.atOom};
            },
            [](const core::StepModeWaiting& e) {
                return EventRow{e.time, tr("step by step"),
                                tr("step %1: waiting before micro-batch %2 (%3 samples from position %4)")
                                    .arg(e.step)
                                    .arg(e.index + 1)
                                    .arg(e.size)
                                    .arg(e.offset),
                                false};
            },
            [](const core::ThroughputTimed& e) {
                return EventRow{e.time, tr("throughput"),
                                e.repetitions == 0
                                    ? tr("timing micro-batch %1 (warm-up, not counted)").arg(e.microBatch)
                                    : tr("micro-batch %1: %2 samples/s (median of %3)")
                                          .arg(e.microBatch)
                                          .arg(e.samplesPerSecond, 0, 'f', 0)
                                          .arg(e.repetitions),
                                false};
            },
            [](const core::ThroughputChecked& e) {
                return EventRow{e.time, tr("throughput"),
                                tr("whole batches of %1 and %2, turn %3: %4× (median %5×, with 95% confidence %6× "
                                   "to %7×)")
                                    .arg(e.microBatch)
                                    .arg(e.largestMicroBatch)
                                    .arg(e.turn)
                                    .arg(e.ratio, 0, 'f', 3)
                                    .arg(e.gain, 0, 'f', 3)
                                    .arg(e.gainLow, 0, 'f', 3)
                                    .arg(e.gainHigh, 0, 'f', 3),
                                false};
            },
            [](const core::ThroughputChosen& e) {
                return EventRow{e.time, tr("throughput"),
                                tr("chose micro-batch %1 (%2): %3")
                                    .arg(e.microBatch)
                                    .arg(planCaption(e.targetBatch, e.microBatch), str(e.reason)),
                                false};
            },
            [](const core::ValidationDone& e) {
                return EventRow{e.time, tr("validation"), validationText(e), false};
            },
            [](const core::RanksStepped& e) {
                QString ranks;
                for (const core::RankStep& r : e.ranks) {
                    if (!ranks.isEmpty()) ranks += QStringLiteral("; ");
                    ranks += tr("rank %1 (%2): %3 samples in micro-batches of %4, %5 samples/s, waited %6 s")
                                 .arg(r.rank)
                                 .arg(str(r.device))
                                 .arg(r.share)
                                 .arg(r.microBatch)
                                 .arg(r.samplesPerSecond, 0, 'f', 0)
                                 .arg(r.waitSeconds, 0, 'f', 2);
                }
                if (!e.nextShares.empty()) {
                    QStringList shares;
                    for (const int64_t share : e.nextShares) shares << QString::number(share);
                    ranks += tr("; next shares %1: %2").arg(shares.join(QStringLiteral(" + ")), str(e.shareReason));
                }
                return EventRow{e.time, tr("ranks"), ranks, false};
            },
            [](const core::RankProbed& e) {
                // One row per report: the trials of each of the rank's probes, then its OOMs.
                QStringList parts;
                bool problem = !e.ooms.empty();
                for (const core::ProbeStarted& p : e.probes)
                    parts << tr("probe %1 (%2), up to %3")
                                 .arg(p.sequence)
                                 .arg(latin(core::toString(p.reason)))
                                 .arg(p.upperBound);
                QStringList trials;
                for (const core::ProbeTrial& t : e.trials) {
                    trials << tr("%1 %2").arg(t.microBatch).arg(t.fit ? tr("fits") : tr("out of memory"));
                    problem = problem || !t.fit;
                }
                if (!trials.isEmpty()) parts << tr("tried %1").arg(trials.join(QStringLiteral(", ")));
                for (const core::ProbeFinished& f : e.finished)
                    parts << tr("probe %1 chose micro-batch %2 × %3")
                                 .arg(f.sequence)
                                 .arg(f.microBatch)
                                 .arg(f.accumulationSteps);
                for (const core::OomEvent& o : e.ooms) {
                    QString oom = tr("OOM at step %1, %2, micro-batch %3")
                                      .arg(o.step)
                                      .arg(latin(core::toString(o.phase)))
                                      .arg(o.microBatch);
                    if (o.recovered && o.newMicroBatch > 0)
                        oom += tr(" → replayed at micro-batch %1").arg(o.newMicroBatch);
                    else if (!o.recovered)
                        oom += tr(" → not recovered");
                    parts << oom;
                }
                return EventRow{e.time, tr("rank %1 probe").arg(e.rank),
                                tr("rank %1 (%2): %3").arg(e.rank).arg(str(e.device), parts.join(QStringLiteral("; "))),
                                problem};
            },
            [](const core::SaverSurvey& e) {
                return EventRow{
                    e.time, tr("memory savers"),
                    tr("measured in %1 s (%2): %3").arg(e.seconds, 0, 'f', 1).arg(str(e.reason), str(e.advice)), false};
            },
            [](const core::MemorySaversChanged& e) {
                QString text = tr("%1 → %2 at step %3").arg(str(e.from), str(e.to)).arg(e.step);
                if (e.predictedMicroBatch > 0) text += tr(" (predicted micro-batch %1)").arg(e.predictedMicroBatch);
                return EventRow{e.time, tr("memory savers"), text + QStringLiteral(": ") + str(e.why), false};
            },
            [](const core::LossScaleChanged& e) {
                if (!e.overflow) {
                    return EventRow{e.time, tr("loss scale"),
                                    tr("%1 → %2 at step %3: %4 steps without a float16 overflow")
                                        .arg(e.from, 0, 'g', 6)
                                        .arg(e.to, 0, 'g', 6)
                                        .arg(e.step)
                                        .arg(core::kLossScaleGrowthSteps),
                                    false};
                }
                return EventRow{e.time, tr("loss scale"),
                                tr("step %1: float16 gradients overflowed at loss scale %2: no step taken, the "
                                   "batch's %3 samples are trained again at %4")
                                    .arg(e.step)
                                    .arg(e.from, 0, 'g', 6)
                                    .arg(e.redoneSamples)
                                    .arg(e.to, 0, 'g', 6),
                                false};
            },
            [](const core::EquivalenceChecked& e) {
                if (!e.error.empty()) return EventRow{e.time, tr("equivalence"), str(e.error), true};
                return EventRow{e.time, tr("equivalence"),
                                tr("%1 samples in %2 micro-batches against one pass: relative "
                                   "difference %3, cosine %4")
                                    .arg(e.samples)
                                    .arg(static_cast<qint64>(e.microBatchSizes.size()))
                                    .arg(e.overall.relativeDifference, 0, 'g', 3)
                                    .arg(e.overall.cosineSimilarity, 0, 'f', 9),
                                e.batchStatistics};
            },
        },
        event);
}

QString validationText(const core::ValidationDone& e) {
    QString metrics = tr("loss %1").arg(e.loss, 0, 'f', 4);
    if (e.accuracy >= 0) metrics += tr(", accuracy %1%").arg(100.0 * e.accuracy, 0, 'f', 1);
    if (e.top5Accuracy >= 0) metrics += tr(", top-5 %1%").arg(100.0 * e.top5Accuracy, 0, 'f', 1);
    if (e.meanSquaredError >= 0) metrics += tr(", MSE %1").arg(e.meanSquaredError, 0, 'g', 4);
    if (e.meanAbsoluteError >= 0) metrics += tr(", MAE %1").arg(e.meanAbsoluteError, 0, 'g', 4);
    QString text = tr("after step %1: %2 on %3 held-out samples (micro-batch %4, %5 s)")
                       .arg(e.step)
                       .arg(metrics)
                       .arg(e.samples)
                       .arg(e.microBatch)
                       .arg(e.seconds, 0, 'f', 2);
    if (e.ooms > 0) text += tr("; %1 out-of-memory error(s) recovered").arg(e.ooms);
    return text;
}

QString planCaption(qint64 targetBatch, qint64 microBatch) {
    if (targetBatch <= 0 || microBatch <= 0) return {};
    const core::EvenSplit even = core::EvenSplit::of(targetBatch, microBatch);
    return QCoreApplication::translate("EventText", "%1 = %2 (micro-batch %3, %4 accumulation steps)")
        .arg(targetBatch)
        .arg(QString::fromStdString(even.sum()))
        .arg(microBatch)
        .arg(even.parts);
}

}  // namespace batchpilot::ui
