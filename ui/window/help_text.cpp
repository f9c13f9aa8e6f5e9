#include "ui/window/help_text.h"

#include <QCoreApplication>
#include <QLocale>

#include "core/plan/accumulation_plan.h"
#include "core/base/byte_size.h"
#include "core/device/math_libraries.h"
#include "core/plan/memory_report.h"
#include "ui/charts/charts_panel.h"
#include "ui/charts/live_chart.h"
#include "ui/charts/loss_chart.h"
#include "ui/charts/memory_chart.h"
#include "ui/session/run_model.h"
#include "ui/session/trainer_controller.h"
#include "ui/charts/probe_chart.h"
#include "ui/charts/throughput_chart.h"
#include "ui/session/event_text.h"
#include "ui/teaching/micro_batch_table.h"
#include "ui/style/text.h"

namespace batchpilot::ui {

namespace {

QString tr(const char* text) {
    return QCoreApplication::translate("HelpText", text);
}

QString bytes(double value) {
    return str(core::formatBytes(static_cast<int64_t>(value)));
}

/// A paragraph about the user's own run, set apart from the general text.
QString yourRun(const QString& text) {
    return QStringLiteral("<blockquote><b>%1</b> %2</blockquote>").arg(tr("In your run:"), text);
}

QString targetPart(const RunModel& run) {
    if (!run.hasRun() || run.targetBatch() <= 0) return {};
    QString text = tr("the target batch is <b>T = %1</b> samples").arg(run.targetBatch());
    if (const auto& summary = run.digest().summary; summary && !summary->model.empty())
        text += tr(", the model is %1 with %2 trainable numbers")
                    .arg(str(summary->model).toHtmlEscaped(), QLocale().toString(summary->parameterCount));
    if (!run.device().isEmpty()) text += tr(", and it trains on <b>%1</b>").arg(run.device().toHtmlEscaped());
    return yourRun(text + QStringLiteral("."));
}

QString probePart(const RunModel& run) {
    const core::RunDigest& d = run.digest();
    if (d.trials.empty() && !d.probeFinished) return {};
    QStringList tried;
    for (const core::ProbeTrial& t : d.trials)
        tried << QStringLiteral("%1 %2")
                     .arg(t.microBatch)
                     .arg(t.fit ? QStringLiteral("✓") : QStringLiteral("✗ (out of memory)"));
    QString text = tr("the latest probe ran %1 trials: %2.").arg(d.trials.size()).arg(tried.join(QStringLiteral(", ")));
    if (const auto& probe = d.probeFinished) {
        text += tr(" It chose a micro-batch of <b>%1</b> samples").arg(probe->microBatch);
        const qint64 usable = d.probeStarted ? d.probeStarted->usableBytes : 0;
        if (usable > 0) text += tr(" for %1 of usable memory").arg(bytes(static_cast<double>(usable)));
        text += QStringLiteral(".");
        if (probe->bytesPerSample > 0) {
            const core::MemoryModel model{probe->fixedBytes, probe->bytesPerSample};
            text += tr(" The memory it measured fits the line %1: the fixed part is the weights, "
                       "their gradients and the optimizer state, the part per sample is the "
                       "activations kept for the backward pass.")
                        .arg(str(core::describeMemoryModel(model)).toHtmlEscaped());
        }
        if (probe->hitTrialLimit) text += tr(" It stopped at its trial limit.");
    } else {
        text += tr(" It is still searching.");
    }
    return yourRun(text);
}

QString fastestPart(const RunModel& run) {
    const core::RunDigest& d = run.digest();
    if (d.timings.empty() && !d.throughputChosen) return {};
    QStringList timed;
    for (const core::ThroughputTimed& t : d.timings)
        if (t.repetitions > 0) timed << tr("%1 → %2 samples/s").arg(t.microBatch).arg(t.samplesPerSecond, 0, 'f', 0);
    // Before the first counted timing only warm-ups ran: an empty list would read "so far: .".
    QString text = timed.isEmpty() ? tr("no size has a counted timing yet (each size's first micro-batch is a "
                                        "warm-up, not counted).")
                                   : tr("the sizes timed so far: %1.").arg(timed.join(QStringLiteral(", ")));
    if (const auto& c = d.throughputChosen) {
        if (c->microBatch != c->largestMicroBatch && c->speedOverLargest > 0) {
            text += tr(" It chose <b>%1</b> rather than the largest that fits, %2: its micro-batches ran %3× as "
                       "fast, timed in turns with it (%4 against %5 samples/s over the whole timing, while the "
                       "machine's own speed varied).")
                        .arg(c->microBatch)
                        .arg(c->largestMicroBatch)
                        .arg(c->speedOverLargest, 0, 'f', 2)
                        .arg(c->samplesPerSecond, 0, 'f', 0)
                        .arg(c->largestSamplesPerSecond, 0, 'f', 0);
            // What a user sees in the step times: the same gain per whole training batch, with what
            // every batch costs besides its micro-batches (the optimizer step above all).
            if (!c->batchRatios.empty()) {
                text += tr(" Whole training batches of the two, optimizer step included, timed in %1 turns over "
                           "%2 s before the decision, ran <b>%3×</b> as fast")
                            .arg(c->batchRatios.size())
                            .arg(c->checkSeconds, 0, 'f', 0)
                            .arg(c->stepSpeedOverLargest, 0, 'f', 2);
                // The interval (absent from the events files of versions before it).
                text += c->batchGainHigh > 0 ? tr(" (with 95% confidence between %1× and %2×).")
                                                   .arg(c->batchGainLow, 0, 'f', 2)
                                                   .arg(c->batchGainHigh, 0, 'f', 2)
                                             : QStringLiteral(".");
            } else if (c->stepSpeedOverLargest > 0)
                text +=
                    tr(" A whole training batch, its optimizer step included (%1 ms besides the micro-batches), "
                       "runs about <b>%2×</b> as fast.")
                        .arg(1000 * (c->stepSeconds + c->microBatchSeconds * static_cast<double>(c->accumulationSteps)),
                             0, 'f', 0)
                        .arg(c->stepSpeedOverLargest, 0, 'f', 2);
        } else if (c->microBatch != c->largestMicroBatch)
            text += tr(" It chose <b>%1</b>, starting from the size it chose before; the largest that fits, %2, "
                       "was not timed: the sizes next to %1 already ran slower.")
                        .arg(c->microBatch)
                        .arg(c->largestMicroBatch);
        else if (!c->batchRatios.empty())
            text += tr(" It kept the largest that fits, <b>%1</b>: a smaller size looked faster in its "
                       "micro-batches, but whole training batches of the two, timed in %2 turns over %3 s, were not.")
                        .arg(c->microBatch)
                        .arg(c->batchRatios.size())
                        .arg(c->checkSeconds, 0, 'f', 0);
        else
            text += tr(" It kept the largest that fits, <b>%1</b>: smaller sizes were not faster.").arg(c->microBatch);
        text += tr(" The timing took %1 training micro-batches (%2 s), all of which trained.")
                    .arg(c->microBatchesTimed)
                    .arg(c->seconds, 0, 'f', 1);
    } else {
        text += tr(" It is still timing.");
    }
    return yourRun(text);
}

QString accumulationPart(const RunModel& run) {
    // The plan training uses now: the probe's, or the fastest size timed after it.
    const RunPlan& plan = run.plan();
    if (plan.microBatch <= 0 || plan.targetBatch <= 0) return {};
    const qint64 target = plan.targetBatch;
    const qint64 micro = plan.microBatch;
    const core::EvenSplit split = core::EvenSplit::of(target, micro);
    QString weights = lossWeightText(split.sizeOf(0), target);
    if (split.larger > 0)
        weights += tr(" for the larger ones and %1 for the others").arg(lossWeightText(split.base, target));
    QString text = tr("%1. Each micro-batch's mean loss is multiplied by <b>%2</b>; the weights "
                      "add up to 1, and the optimizer steps once per %3 samples.")
                       .arg(planCaption(target, micro), weights)
                       .arg(target);
    if (split.parts == 1)
        text +=
            tr(" The whole batch fits at once, so there is nothing to accumulate: lower Max "
               "micro-batch or the device budget to see accumulation.");
    if (run.steps() > 0) text += tr(" %1 optimizer steps so far.").arg(run.steps());
    return yourRun(text);
}

QString oomPart(const RunModel& run) {
    if (!run.hasRun()) return {};
    if (run.trainingOoms() == 0)
        return yourRun(
            tr("no out-of-memory error has happened while training so far (the probe's "
               "own failed trials do not count: they are how it finds the limit)."));
    return yourRun(tr("%1 out-of-memory errors happened while training and all were recovered: "
                      "%2 samples of the failed micro-batches were run again in smaller "
                      "micro-batches, none lost and none counted twice.")
                       .arg(run.trainingOoms())
                       .arg(run.samplesReplayed()));
}

QString equivalencePart(const RunModel& run) {
    if (!run.hasRun()) return {};
    const auto& last = run.digest().equivalence;
    if (!last) return yourRun(tr("no check yet: press <i>Check equivalence</i> in the run panel."));
    const core::EquivalenceChecked& e = *last;
    if (!e.error.empty()) return yourRun(tr("the last check could not run: %1").arg(str(e.error).toHtmlEscaped()));
    QStringList sizes;
    for (int64_t size : e.microBatchSizes) sizes << QString::number(size);
    return yourRun(tr("the last check split %1 samples as %2 and found a relative difference of "
                      "<b>%3</b> (cosine similarity %4). %5")
                       .arg(e.samples)
                       .arg(sizes.join(QStringLiteral(" + ")))
                       .arg(e.overall.relativeDifference, 0, 'g', 3)
                       .arg(e.overall.cosineSimilarity, 0, 'f', 9)
                       .arg(str(e.explanation).toHtmlEscaped()));
}

}  // namespace

QString howItWorksHtml() {
    const RunModel none;
    return howItWorksHtml(none);
}

QString howItWorksHtml(const RunModel& f) {
    QString html;
    if (!f.hasRun())
        html +=
            tr("<p><i>Start a run and open this again: every part will then also show what "
               "happened in your run, with its own numbers.</i></p>");
    html += tr(R"(
<h3>The target batch</h3>
<p>You choose how many samples the optimizer should see per step: the <b>target batch</b>, say
1024. Whether 1024 images fit in the device's memory at once depends on the model and the
device, so BatchPilot does not try to push them through in one go.</p>
)");
    html += targetPart(f);
    html += tr(R"(
<h3>Probing: the largest micro-batch that fits</h3>
<p>BatchPilot runs real forward and backward passes on growing <b>micro-batches</b>: 1, 2, 4, 8…
until one runs out of memory. After two successes it fits a straight line through the measured
memory peaks and jumps to the size the line predicts will just fit; then it narrows the gap
between the largest size that fit and the smallest that did not. A part of memory, the
<b>headroom</b>, is kept free. Trials that fit are not wasted: their gradients count toward the
first training batch. The <i>Probe</i> chart shows every trial: green circles fit, red squares ran
out of memory, the dashed line is the size chosen.</p>
)");
    html += probePart(f);
    html += tr(R"(
<h3>Fastest, not just largest</h3>
<p>The largest micro-batch that fits is often not the fastest: on a CPU the caches decide, on a
GPU throughput levels off long before memory runs out. So after the probe, BatchPilot times
smaller sizes — halving, each one a size that splits the target batch evenly — on real training
micro-batches (every one of them trains, none is wasted), each new size in turns with the best so
far (best, new, best, …, so a machine whose speed drifts slows both alike), and keeps the
fastest. Two sizes within the measuring noise go to the larger. After a re-probe
(a larger budget, say) it starts from the size it chose before and times its neighbours first,
rather than the largest, slowest sizes. The <i>Fastest
micro-batch</i> tab shows each size it timed. Choose <i>largest that fits</i> in the run panel
(or <code>--objective largest</code>) to skip this.</p>
)");
    html += fastestPart(f);
    html += tr(R"(
<h3>Accumulation: reaching the target exactly</h3>
<p>With micro-batch <i>m</i> the target <i>T</i> is split into <i>k = ⌈T/m⌉</i> micro-batches of
nearly equal size. Each one's loss is weighted by its share of the batch, <i>n<sub>i</sub>/T</i>
(for example 32/1024 = 0.03125), its gradients are added up, and the optimizer steps once, after
the last one. The result equals one big batch of <i>T</i>, up to rounding. The <i>Training
batch</i> bar fills with each micro-batch and flashes on the optimizer step; the table under it
lists each micro-batch's weight, its samples and the gradient summed so far.</p>
)");
    html += accumulationPart(f);
    html += tr(R"(
<h3>Out of memory while training</h3>
<p>Memory can run out later too (another process, a larger input). BatchPilot then throws away
the failed micro-batch's unfinished work, frees memory, picks a smaller micro-batch and runs the
same samples again, so no sample is lost or counted twice. Red lines on the memory chart and the
training-batch bar mark where it happened. After some clean steps it tries to grow again.</p>
)");
    html += oomPart(f);
    html += tr(R"(
<h3>Seeing it step by step, and checking it</h3>
<p>Turn on <b>Step by step</b> in the run panel and the trainer waits before every micro-batch:
<i>Next micro-batch</i> (N) runs one, <i>Finish batch</i> (F) runs the rest of the batch and the
optimizer step. <b>Check equivalence</b> computes the last batch's gradient both ways, summed
over the micro-batches and in one full pass, and compares them. Without BatchNorm they agree up
to float rounding (a relative difference around 1e-7). BatchNorm normalises each micro-batch
with its own mean and variance, so there the two differ: that is the model, not the
accumulation.</p>
)");
    html += equivalencePart(f);
    html += tr(R"(
<h3>Virtual GPUs</h3>
<p>A <b>virtual GPU</b> is the CPU with a hard memory budget: allocations past the budget fail
exactly like a GPU running out of memory. It lets you watch all of the above on any computer.
Switch the budget during a run and the trainer moves there at the next batch and probes again.</p>
)");
    return html;
}

QString aboutHtml() {
    const core::MathLibraries math = core::mathLibraries(0, TrainerController::kGuiReservedCpus);
    const std::string warning = core::referenceBlasWarning(math);
    return QCoreApplication::translate("HelpText",
                                       "<h3>BatchPilot %1</h3>"
                                       "<p>Train at the batch you want on the device you get: "
                                       "finds the largest micro-batch that fits, accumulates to "
                                       "the target batch exactly, and survives out-of-memory "
                                       "errors without losing a sample.</p>"
                                       "<p>Built with Qt %2. Computes with %3.</p>%4")
        .arg(QCoreApplication::applicationVersion(), QString::fromLatin1(qVersion()),
             QString::fromStdString(core::describe(math)).toHtmlEscaped(),
             warning.empty() ? QString()
                             : QStringLiteral("<p><b>%1</b></p>").arg(QString::fromStdString(warning).toHtmlEscaped()));
}

void explainCharts(ChartsPanel& charts) {
    const auto explain = [](LiveChart* chart, const QString& tip) {
        if (chart != nullptr && chart->toolTip().isEmpty()) chart->setToolTip(tip);
    };
    explain(charts.lossChart(), tr("The training loss after every optimizer step: how wrong the model still is on "
                                   "its batch. Faint: each step's value; bold: smoothed, so the trend shows through "
                                   "the noise."));
    explain(charts.probeChart(), tr("Every micro-batch size the probe tried and the memory it needed: green fit, red "
                                    "ran out of memory. The dashed line is the size chosen, the largest that fits with "
                                    "headroom to spare."));
    explain(charts.memoryChart(),
            tr("Device memory over time: what is allocated now, the peak of each micro-batch, and "
               "the device's limit. Red lines mark out-of-memory errors, which the trainer "
               "recovered from."));
    explain(charts.throughputChart(),
            tr("Samples trained per second, and the micro-batch plan in use. Larger micro-batches "
               "usually train faster, which is why the probe looks for the largest that fits."));
}

}  // namespace batchpilot::ui
