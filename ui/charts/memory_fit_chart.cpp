#include "ui/charts/memory_fit_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <QChart>
#include <QHBoxLayout>
#include <QLabel>
#include <QLegendMarker>
#include <QLineSeries>
#include <QScatterSeries>
#include <QVBoxLayout>
#include <QValueAxis>

#include "core/base/byte_size.h"
#include "core/plan/memory_report.h"
#include "ui/charts/what_if_row.h"

namespace batchpilot::ui {

namespace {

double mib(double bytes) {
    return bytes / (1024.0 * 1024.0);
}

QString mibText(double bytes) {
    return MemoryFitChart::tr("%1 MiB").arg(mib(bytes), 0, 'f', 1);
}

}  // namespace

MemoryFitChart::MemoryFitChart(QWidget* parent) : LiveChart(tr("Memory against micro-batch (latest probe)"), parent) {
    m_yAxis = new QValueAxis;
    m_yAxis->setTitleText(tr("peak memory (MiB)"));
    m_yAxis->setLabelFormat(QStringLiteral("%.0f"));
    chart()->addAxis(m_yAxis, Qt::AlignLeft);
    setPaddedRange(m_yAxis, 0, 64, /*fromZero=*/true);
    xAxis()->setTitleText(tr("micro-batch (samples)"));
    xAxis()->setLabelFormat(QStringLiteral("%.0f"));
    setPaddedRange(xAxis(), 0, 64, /*fromZero=*/true);

    m_capacityLine = new QLineSeries;
    m_capacityLine->setName(tr("capacity"));
    m_usableLine = new QLineSeries;
    m_usableLine->setName(tr("usable (headroom line)"));
    m_fitLine = new QLineSeries;
    m_fitLine->setName(tr("fitted line"));
    m_chosenLine = new QLineSeries;
    m_chosenLine->setName(tr("chosen"));
    m_whatIfLine = new QLineSeries;
    m_whatIfLine->setName(tr("what-if"));
    const TrialMarkers markers = TrialMarkers::create();
    m_fits = markers.fits;
    m_tight = markers.tight;
    m_ooms = markers.ooms;
    m_whatIfPoint = new QScatterSeries;
    m_whatIfPoint->setMarkerShape(QScatterSeries::MarkerShapeRotatedRectangle);
    m_whatIfPoint->setMarkerSize(12);
    for (QXYSeries* series :
         {static_cast<QXYSeries*>(m_capacityLine), static_cast<QXYSeries*>(m_usableLine),
          static_cast<QXYSeries*>(m_fitLine), static_cast<QXYSeries*>(m_chosenLine),
          static_cast<QXYSeries*>(m_whatIfLine), static_cast<QXYSeries*>(m_fits), static_cast<QXYSeries*>(m_tight),
          static_cast<QXYSeries*>(m_ooms), static_cast<QXYSeries*>(m_whatIfPoint)}) {
        chart()->addSeries(series);
        series->attachAxis(xAxis());
        series->attachAxis(m_yAxis);
    }
    for (QLegendMarker* marker : chart()->legend()->markers(m_whatIfPoint)) marker->setVisible(false);

    const auto tip = [this](const QPointF& p) {
        const Trial* trial = nearestTrial(p);
        return trial ? describe(*trial) : QString();
    };
    showTipsFor(m_fits, tip);
    showTipsFor(m_tight, tip);
    showTipsFor(m_ooms, tip);
    showTipsFor(m_fitLine, [this](const QPointF& p) {
        if (!m_model) return QString();
        const double n = std::max(0.0, p.x());
        return tr("fitted line: %1\nat micro-batch %2: %3")
            .arg(QString::fromStdString(core::describeMemoryModel(*m_model)))
            .arg(std::llround(n))
            .arg(mibText(m_model->fixedBytes + m_model->bytesPerSample * n));
    });
    showTipsFor(m_capacityLine,
                [this](const QPointF&) { return tr("capacity: %1").arg(mibText(static_cast<double>(m_capacity))); });
    showTipsFor(m_usableLine, [this](const QPointF&) {
        return tr("usable: %1 (capacity minus headroom); the probe chooses the largest micro-batch under it")
            .arg(mibText(static_cast<double>(m_usable)));
    });
    showTipsFor(m_chosenLine, [this](const QPointF&) { return tr("chosen micro-batch: %1 samples").arg(m_chosen); });
    showTipsFor(m_whatIfPoint, [this](const QPointF&) { return whatIfText(); });

    // Caption and the what-if row under the chart.
    m_caption = new QLabel;
    m_caption->setObjectName(QStringLiteral("memoryFitCaption"));
    m_caption->setWordWrap(true);
    m_caption->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_caption->setContentsMargins(6, 2, 6, 2);

    m_whatIf = new WhatIfRow;
    connect(m_whatIf, &WhatIfRow::changed, this, [this] { markDirty(); });
    if (auto* box = qobject_cast<QVBoxLayout*>(layout())) {
        box->addWidget(m_caption);
        box->addWidget(m_whatIf);
    }
    applyColors(colors());
    updateCaption();
    syncWhatIf();
}

void MemoryFitChart::handle(const core::Event& event) {
    if (const auto* started = std::get_if<core::ProbeStarted>(&event)) {
        m_sequence = started->sequence;
        m_upperBound = started->upperBound;
        m_usable = started->usableBytes;
        m_trials.clear();
        m_finished = false;
        m_modelFromProbe = false;
        m_model.reset();
        m_chosen = 0;
        updateRange();
    } else if (const auto* trial = std::get_if<core::ProbeTrial>(&event)) {
        if (trial->sequence != m_sequence) {
            // A trial whose start we did not see: it begins a new probe.
            m_sequence = trial->sequence;
            m_trials.clear();
            m_finished = false;
            m_modelFromProbe = false;
            m_model.reset();
        }
        // A probe runs at most kMaxProbeTrials trials: a file that claims more for one probe is
        // shown up to that many, so that each trial costs the fit no more than a probe's worth.
        if (m_trials.size() >= static_cast<size_t>(core::kMaxProbeTrials)) return;
        m_trials.push_back({trial->trial, trial->microBatch, trial->fit, trial->withinHeadroom, trial->peakBytes,
                            trial->failedAllocationBytes});
        if (!m_modelFromProbe) refitFromTrials();
        updateRange();
    } else if (const auto* finished = std::get_if<core::ProbeFinished>(&event)) {
        m_finished = true;
        m_chosen = finished->microBatch;
        if (finished->bytesPerSample > 0) {
            m_model = core::MemoryModel{finished->fixedBytes, finished->bytesPerSample};
            m_modelFromProbe = true;
        } else {
            refitFromTrials();
        }
        updateRange();
        setWhatIf(m_chosen > 0 ? m_chosen : 1);
    } else if (const auto* sample = std::get_if<core::MemorySample>(&event)) {
        if (sample->capacityBytes == m_capacity) return;
        m_capacity = sample->capacityBytes;
        if (m_usable == 0) m_usable = sample->headroomBytes;
    } else if (const auto* breakdown = std::get_if<core::MemoryBreakdown>(&event)) {
        if (breakdown->capacityBytes == m_capacity && breakdown->usableBytes == m_usable) return;
        m_capacity = breakdown->capacityBytes;
        m_usable = breakdown->usableBytes;
    } else {
        return;
    }
    updateCaption();
    syncWhatIf();
    markDirty();
}

void MemoryFitChart::setTargetBatch(qint64 target) {
    if (target == m_target) return;
    m_target = target;
    updateCaption();
    syncWhatIf();
    markDirty();
}

void MemoryFitChart::clear() {
    m_sequence = 0;
    m_upperBound = 0;
    m_usable = 0;
    m_capacity = 0;
    m_target = 0;
    m_chosen = 0;
    m_finished = false;
    m_modelFromProbe = false;
    m_model.reset();
    m_trials.clear();
    for (QXYSeries* series :
         {static_cast<QXYSeries*>(m_capacityLine), static_cast<QXYSeries*>(m_usableLine),
          static_cast<QXYSeries*>(m_fitLine), static_cast<QXYSeries*>(m_chosenLine),
          static_cast<QXYSeries*>(m_whatIfLine), static_cast<QXYSeries*>(m_fits), static_cast<QXYSeries*>(m_tight),
          static_cast<QXYSeries*>(m_ooms), static_cast<QXYSeries*>(m_whatIfPoint)})
        series->clear();
    updateRange();
    updateCaption();
    syncWhatIf();
    markDirty();
}

int MemoryFitChart::plottedTrialCount() const {
    return static_cast<int>(m_fits->count() + m_tight->count() + m_ooms->count());
}

void MemoryFitChart::refitFromTrials() {
    std::vector<core::TrialOutcome> outcomes;
    outcomes.reserve(m_trials.size());
    for (const Trial& t : m_trials) outcomes.push_back({t.microBatch, t.fit, t.peakBytes});
    m_model = core::fitMemoryModel(outcomes);
}

void MemoryFitChart::updateRange() {
    qint64 largest = std::max(m_upperBound, 2 * m_chosen);
    for (const Trial& t : m_trials) largest = std::max(largest, t.microBatch);
    m_whatIf->setMaximum(largest);
}

void MemoryFitChart::setWhatIf(qint64 microBatch) {
    m_whatIf->setMicroBatch(microBatch);
}

qint64 MemoryFitChart::whatIf() const {
    return m_whatIf->microBatch();
}

QSlider* MemoryFitChart::whatIfSlider() const {
    return m_whatIf->slider();
}

QSpinBox* MemoryFitChart::whatIfBox() const {
    return m_whatIf->spinBox();
}

QString MemoryFitChart::caption() const {
    return m_caption->text();
}

void MemoryFitChart::updateCaption() {
    if (m_trials.empty() && !m_finished) {
        m_caption->setText(
            tr("Each probe trial's peak memory against its micro-batch appears here "
               "once the run probes; the what-if slider then predicts other sizes."));
        return;
    }
    QString text = tr("Probe %1, %2 trial(s). ").arg(m_sequence).arg(m_trials.size());
    if (m_model) {
        text += (m_modelFromProbe ? tr("Memory model (the probe's fit): %1.")
                                  : tr("Memory model (fitted to the fits so far): %1."))
                    .arg(QString::fromStdString(core::describeMemoryModel(*m_model)));
    } else {
        text += tr("No memory model yet: it needs two sizes that fit.");
    }
    if (m_chosen > 0) text += QLatin1Char(' ') + tr("Chosen micro-batch %1.").arg(m_chosen);
    if (m_usable > 0 && m_capacity > 0)
        text += QLatin1Char(' ') + tr("Usable %1 of %2 capacity.")
                                       .arg(QString::fromStdString(core::formatBytes(m_usable)),
                                            QString::fromStdString(core::formatBytes(m_capacity)));
    m_caption->setText(text);
}

void MemoryFitChart::syncWhatIf() {
    m_whatIf->setModel(m_model, m_target, m_usable, m_capacity);
}

QString MemoryFitChart::whatIfText() const {
    return m_whatIf->text();
}

WhatIfRow::Verdict MemoryFitChart::whatIfVerdict() const {
    return m_whatIf->verdict();
}

QPointF MemoryFitChart::pointOf(const Trial& t) const {
    const double x = static_cast<double>(t.microBatch);
    if (t.fit) return {x, mib(static_cast<double>(t.peakBytes))};
    if (t.failedBytes > 0) return {x, mib(static_cast<double>(t.peakBytes + t.failedBytes))};
    return {x, mib(static_cast<double>(m_capacity > 0 ? m_capacity : m_usable))};
}

void MemoryFitChart::refresh(bool follow) {
    double xMax = 4;
    double yMax = mib(static_cast<double>(std::max(m_capacity, m_usable)));
    for (const Trial& t : m_trials) {
        const QPointF p = pointOf(t);
        xMax = std::max(xMax, p.x());
        yMax = std::max(yMax, p.y());
    }
    TrialMarkers{m_fits, m_tight, m_ooms}.show(m_trials, [this](const Trial& t) { return pointOf(t); });

    const bool haveWhatIf = m_model.has_value() && !m_trials.empty();
    const double whatIfX = static_cast<double>(whatIf());
    double whatIfY = 0;
    if (haveWhatIf) {
        whatIfY = mib(m_model->fixedBytes + m_model->bytesPerSample * whatIfX);
        xMax = std::max(xMax, whatIfX);
        yMax = std::max(yMax, whatIfY);
    }
    xMax = std::max(xMax, static_cast<double>(m_chosen)) * 1.08;
    if (follow) {
        setPaddedRange(xAxis(), 0, xMax, /*fromZero=*/true);
        setPaddedRange(m_yAxis, 0, std::max(yMax, 1.0), /*fromZero=*/true);
    }
    const double x0 = std::min(0.0, xAxis()->min());
    const double x1 = std::max(xMax, xAxis()->max());
    const double yTop = m_yAxis->max();

    const auto horizontal = [&](QLineSeries* series, qint64 bytes) {
        if (bytes > 0)
            series->replace(
                QList<QPointF>{{x0, mib(static_cast<double>(bytes))}, {x1, mib(static_cast<double>(bytes))}});
        else
            series->clear();
    };
    horizontal(m_capacityLine, m_capacity);
    horizontal(m_usableLine, m_usable);
    if (m_model && !m_trials.empty()) {
        const double a = mib(m_model->fixedBytes);
        const double b = mib(m_model->bytesPerSample);
        m_fitLine->replace(QList<QPointF>{{0, a}, {x1, a + b * x1}});
    } else {
        m_fitLine->clear();
    }
    if (m_chosen > 0)
        m_chosenLine->replace(
            QList<QPointF>{{static_cast<double>(m_chosen), 0}, {static_cast<double>(m_chosen), yTop}});
    else
        m_chosenLine->clear();
    if (haveWhatIf) {
        m_whatIfLine->replace(QList<QPointF>{{whatIfX, 0}, {whatIfX, yTop}});
        m_whatIfPoint->replace(QList<QPointF>{{whatIfX, whatIfY}});
    } else {
        m_whatIfLine->clear();
        m_whatIfPoint->clear();
    }
}

const MemoryFitChart::Trial* MemoryFitChart::nearestTrial(const QPointF& point) const {
    return nearestOnChart(
        m_trials, [this](const Trial& t) { return pointOf(t); }, point, xAxis(), m_yAxis);
}

QString MemoryFitChart::describe(const Trial& t) const {
    QString text = tr("trial %1: micro-batch %2, ").arg(t.trial).arg(t.microBatch);
    if (t.fit) {
        text += t.withinHeadroom ? tr("fits") : tr("fits, but past the headroom line");
        text += tr("\npeak %1").arg(QString::fromStdString(core::formatBytes(t.peakBytes)));
        return text;
    }
    text += tr("out of memory");
    if (t.failedBytes > 0)
        text += tr("\nplotted at peak %1 + failed allocation %2: at least what it needed")
                    .arg(QString::fromStdString(core::formatBytes(t.peakBytes)),
                         QString::fromStdString(core::formatBytes(t.failedBytes)));
    else
        text += tr("\nplotted at the capacity line: how much it needed is unknown");
    return text;
}

void MemoryFitChart::applyColors(const ChartColors& c) {
    TrialMarkers{m_fits, m_tight, m_ooms}.applyColors(c);
    m_capacityLine->setPen(linePen(c.limit, 1.5));
    m_usableLine->setPen(linePen(c.headroom, 1.5, Qt::DashLine));
    m_fitLine->setPen(linePen(c.primary, 2.0));
    // Green like the fits: the chosen size is the largest that fit under the headroom line.
    m_chosenLine->setPen(linePen(c.fit, 1.5, Qt::DashLine));
    m_whatIfLine->setPen(linePen(c.tertiary, 1.5, Qt::DotLine));
    m_whatIfPoint->setColor(c.tertiary);
    m_whatIfPoint->setBorderColor(c.tertiary.darker(130));
    m_yAxis->setLabelFormat(QStringLiteral("%.0f"));
    xAxis()->setLabelFormat(QStringLiteral("%.0f"));
    m_whatIf->setVerdictColors(c.fit, c.tight, c.oom);
}

}  // namespace batchpilot::ui
