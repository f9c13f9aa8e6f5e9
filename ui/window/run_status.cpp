#include "ui/window/run_status.h"

#include <algorithm>

#include <QLabel>
#include <QProgressBar>
#include <QStatusBar>

#include "core/plan/accumulation_plan.h"
#include "core/base/byte_size.h"
#include "ui/session/run_model.h"

namespace batchpilot::ui {

namespace {

QString duration(double seconds) {
    const auto s = static_cast<qint64>(seconds + 0.5);
    if (s >= 3600)
        return QStringLiteral("%1:%2:%3")
            .arg(s / 3600)
            .arg((s / 60) % 60, 2, 10, QLatin1Char('0'))
            .arg(s % 60, 2, 10, QLatin1Char('0'));
    return QStringLiteral("%1:%2").arg(s / 60).arg(s % 60, 2, 10, QLatin1Char('0'));
}

QLabel* field(QStatusBar* bar, const QString& name, const QString& tip) {
    auto* label = new QLabel;
    label->setObjectName(name);
    label->setToolTip(tip);
    label->setContentsMargins(4, 0, 4, 0);
    bar->addWidget(label);
    return label;
}

}  // namespace

RunStatus::RunStatus(QStatusBar* bar, const RunModel* run, QObject* parent) : QObject(parent), m_run(run) {
    m_state = field(bar, QStringLiteral("statusState"),
                    tr("What the trainer is doing: probing for the largest micro-batch, "
                       "training, paused or finished."));
    m_device = field(bar, QStringLiteral("statusDevice"),
                     tr("The device the trainer runs on. Its memory decides how many samples fit "
                        "in one micro-batch."));
    m_plan = field(bar, QStringLiteral("statusPlan"),
                   tr("Target batch = micro-batches × their size: how the batch you asked "
                      "for is split into pieces that fit in memory."));
    m_step = field(bar, QStringLiteral("statusStep"),
                   tr("Optimizer steps done (one per target batch) and the epoch: how many times "
                      "the whole dataset has been seen."));
    m_rate = field(bar, QStringLiteral("statusRate"),
                   tr("Training throughput in samples per second. Larger micro-batches usually "
                      "use the device better."));
    m_ranks = field(bar, QStringLiteral("statusRanks"),
                    tr("Several devices: each rank's samples per second, the rank that waited longest for the "
                       "others before the gradients were summed, and the sum itself (the all-reduce), last "
                       "step. The ranks table above the charts has every rank's wait."));
    m_memory = field(bar, QStringLiteral("statusMemory"),
                     tr("Peak device memory of the last step against the device's capacity: how "
                        "close training runs to the limit."));
    m_progress = new QProgressBar;
    m_progress->setObjectName(QStringLiteral("statusProgress"));
    m_progress->setMaximumWidth(130);
    m_progress->setMaximumHeight(16);
    m_progress->setRange(0, 100);
    bar->addPermanentWidget(m_progress);
    m_eta = new QLabel;
    m_eta->setObjectName(QStringLiteral("statusEta"));
    m_eta->setToolTip(tr("Estimated time until the step limit, from the recent speed."));
    m_progress->setToolTip(tr("Share of the step limit done."));
    bar->addPermanentWidget(m_eta);
    connect(run, &RunModel::changed, this, &RunStatus::refresh);
    clear();
}

void RunStatus::handle(const core::Event& event) {
    if (const auto* metrics = std::get_if<core::StepMetrics>(&event)) {
        m_stepNumber = metrics->step;
        m_epoch = metrics->epoch;
        m_totalSteps = metrics->totalSteps;
        m_samplesPerSecond = metrics->samplesPerSecond;
        m_stepSeconds = metrics->stepSeconds;
        m_peak = metrics->peakBytes;
        m_time = metrics->time;
        if (m_firstStepTime < 0) {
            m_firstStepTime = metrics->time;
            m_firstStep = metrics->step;
        }
    } else if (const auto* sample = std::get_if<core::MemorySample>(&event)) {
        m_capacity = sample->capacityBytes;
    } else if (const auto* ranks = std::get_if<core::RanksStepped>(&event)) {
        // Every rank's speed, and only the longest wait (the ranks table above the charts has
        // every rank's): the line stays short enough for the status bar with several ranks.
        QStringList parts;
        const core::RankStep* longest = nullptr;
        for (const core::RankStep& r : ranks->ranks) {
            parts << tr("#%1 %2/s").arg(r.rank).arg(r.samplesPerSecond, 0, 'f', 0);
            if (longest == nullptr || r.waitSeconds > longest->waitSeconds) longest = &r;
        }
        if (longest != nullptr && longest->waitSeconds >= 0.005)
            parts << tr("#%1 waited %2 s").arg(longest->rank).arg(longest->waitSeconds, 0, 'f', 2);
        else
            parts << tr("no rank waited");
        m_ranksText = tr("%1 · all-reduce %2 ms")
                          .arg(parts.join(QStringLiteral(" · ")))
                          .arg(ranks->allReduceSeconds * 1000, 0, 'f', 1);
    }
}

QString RunStatus::stateText() const {
    return QString::fromLatin1(core::toString(m_run->state()));
}

QString RunStatus::planText() const {
    const RunPlan& plan = m_run->plan();
    if (plan.microBatch <= 0) return tr("micro-batch —");
    // The batch split evenly below the probed size (1024 at 271: 4 × 256), or a step whose
    // micro-batches differed (probe trials, timed sizes, an OOM, a rank's share): at most.
    const core::EvenSplit even = core::EvenSplit::of(plan.targetBatch, plan.microBatch);
    if (even.parts == plan.accumulationSteps)
        return tr("%1 = %2").arg(plan.targetBatch).arg(QString::fromStdString(even.sum()));
    return tr("%1 in %2 × ≤%3").arg(plan.targetBatch).arg(plan.accumulationSteps).arg(plan.microBatch);
}

QString RunStatus::memoryText() const {
    if (m_capacity <= 0) return tr("peak —");
    return tr("peak %1 / %2")
        .arg(QString::fromStdString(core::formatBytes(m_peak)), QString::fromStdString(core::formatBytes(m_capacity)));
}

int RunStatus::progressPercent() const {
    return m_progress->value();
}

void RunStatus::refresh() {
    QString state = stateText();
    state[0] = state[0].toUpper();
    m_state->setText(QStringLiteral("<b>%1</b>").arg(state));
    m_device->setText(m_run->device().isEmpty() ? tr("no device") : m_run->device());
    m_plan->setText(planText());
    m_step->setText(tr("step %1 · epoch %2").arg(m_stepNumber).arg(m_epoch));
    m_rate->setText(tr("%1 samples/s").arg(m_samplesPerSecond, 0, 'f', 0));
    m_memory->setText(memoryText());
    m_ranks->setText(m_ranksText);
    m_ranks->setVisible(!m_ranksText.isEmpty());
    const bool bounded = m_totalSteps > 0;  // 0: the run has no step limit
    m_progress->setVisible(bounded);
    m_eta->setVisible(bounded);
    if (bounded) {
        m_progress->setValue(static_cast<int>(100 * std::min(m_stepNumber, m_totalSteps) / m_totalSteps));
        m_progress->setFormat(tr("%1 / %2 steps").arg(m_stepNumber).arg(m_totalSteps));
        const qint64 done = m_stepNumber - m_firstStep;
        const qint64 left = m_totalSteps - m_stepNumber;
        if (done > 0 && left > 0) {
            const double perStep = (m_time - m_firstStepTime) / static_cast<double>(done);
            m_eta->setText(tr("ETA %1").arg(duration(perStep * static_cast<double>(left))));
        } else {
            m_eta->setText(left <= 0 ? tr("done") : tr("ETA —"));
        }
    }
}

void RunStatus::clear() {
    m_stepNumber = m_epoch = m_totalSteps = 0;
    m_samplesPerSecond = m_stepSeconds = m_time = 0;
    m_firstStepTime = -1;
    m_firstStep = 0;
    m_peak = m_capacity = 0;
    m_ranksText.clear();
    refresh();
}

}  // namespace batchpilot::ui
