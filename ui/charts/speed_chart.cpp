#include "ui/charts/speed_chart.h"

#include <algorithm>
#include <cmath>

#include <QChart>
#include <QLabel>
#include <QLegendMarker>
#include <QLineSeries>
#include <QScatterSeries>
#include <QValueAxis>
#include <QVBoxLayout>

namespace batchpilot::ui {

SpeedChart::SpeedChart(QWidget* parent) : LiveChart(tr("Fastest micro-batch: samples/s by size"), parent) {
    m_rateAxis = new QValueAxis;
    m_rateAxis->setTitleText(tr("samples / s"));
    m_rateAxis->setLabelFormat(QStringLiteral("%.0f"));
    chart()->addAxis(m_rateAxis, Qt::AlignLeft);
    xAxis()->setTitleText(tr("micro-batch"));
    xAxis()->setLabelFormat(QStringLiteral("%.0f"));

    m_line = new QLineSeries;
    m_line->setName(tr("timed"));
    m_points = new QScatterSeries;
    m_points->setMarkerSize(9);
    m_chosenPoint = new QScatterSeries;
    m_chosenPoint->setName(tr("chosen"));
    m_chosenPoint->setMarkerSize(16);
    m_largestLine = new QLineSeries;
    m_largestLine->setName(tr("largest that fits"));
    for (QXYSeries* series : {static_cast<QXYSeries*>(m_largestLine), static_cast<QXYSeries*>(m_line),
                              static_cast<QXYSeries*>(m_points), static_cast<QXYSeries*>(m_chosenPoint)}) {
        chart()->addSeries(series);
        series->attachAxis(xAxis());
        series->attachAxis(m_rateAxis);
    }
    for (QLegendMarker* marker : chart()->legend()->markers(m_points)) marker->setVisible(false);
    const auto tip = [this](const QPointF& p) {
        const Candidate* nearest = nullptr;
        for (const Candidate& c : m_candidates)
            if (!nearest || std::abs(c.microBatch - p.x()) < std::abs(nearest->microBatch - p.x())) nearest = &c;
        if (!nearest) return QString();
        QString text = tr("micro-batch %1: %2 samples/s (median of %3 timings)")
                           .arg(nearest->microBatch)
                           .arg(nearest->samplesPerSecond, 0, 'f', 0)
                           .arg(nearest->repetitions);
        if (nearest->microBatch == m_chosen) text += tr("\nchosen");
        if (nearest->microBatch == m_largest) text += tr("\nthe largest that fits");
        return text;
    };
    showTipsFor(m_points, tip);
    showTipsFor(m_chosenPoint, tip);
    setToolTip(
        tr("Larger micro-batches are not always faster: on a CPU the caches decide, on a GPU "
           "throughput levels off long before memory runs out. After the probe found the largest "
           "size that fits, BatchPilot times smaller sizes on real training micro-batches (none is "
           "wasted) and keeps the fastest; two sizes within the measuring noise go to the larger."));
    m_caption = new QLabel;
    m_caption->setObjectName(QStringLiteral("speedCaption"));
    m_caption->setWordWrap(true);
    m_caption->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_caption->setContentsMargins(6, 2, 6, 2);
    if (auto* box = qobject_cast<QVBoxLayout*>(layout())) box->addWidget(m_caption);
    applyColors(colors());
    updateCaption();
}

QString SpeedChart::caption() const {
    return m_caption->text();
}

void SpeedChart::handle(const core::Event& event) {
    if (std::holds_alternative<core::ProbeStarted>(event)) {
        m_candidates.clear();
        m_chosen = 0;
        m_largest = 0;
        m_reason.clear();
        m_largestObjective = false;
    } else if (const auto* finished = std::get_if<core::ProbeFinished>(&event)) {
        m_largest = finished->microBatch;
        m_largestObjective = true;  // until a timing says otherwise
    } else if (const auto* timed = std::get_if<core::ThroughputTimed>(&event)) {
        m_largestObjective = false;
        if (m_chosen > 0) {
            // Timed again after a decision without a new probe (a throughput drift): a new search.
            m_candidates.clear();
            m_chosen = 0;
            m_reason.clear();
        }
        auto same = std::find_if(m_candidates.begin(), m_candidates.end(),
                                 [&](const Candidate& c) { return c.microBatch == timed->microBatch; });
        if (same == m_candidates.end()) {
            if (m_candidates.size() >= 1000) return;
            m_candidates.push_back({timed->microBatch, timed->samplesPerSecond, timed->repetitions});
        } else {
            same->samplesPerSecond = timed->samplesPerSecond;
            same->repetitions = timed->repetitions;
        }
    } else if (const auto* chosen = std::get_if<core::ThroughputChosen>(&event)) {
        m_largestObjective = false;
        m_chosen = chosen->microBatch;
        m_largest = chosen->largestMicroBatch;
        m_reason = QString::fromStdString(chosen->reason);
    } else {
        return;
    }
    updateCaption();
    markDirty();
}

void SpeedChart::clear() {
    m_candidates.clear();
    m_chosen = m_largest = 0;
    m_reason.clear();
    m_largestObjective = false;
    m_line->clear();
    m_points->clear();
    m_chosenPoint->clear();
    m_largestLine->clear();
    updateCaption();
    markDirty();
}

void SpeedChart::updateCaption() {
    QString text;
    if (m_chosen > 0)
        text = m_chosen == m_largest
                   ? tr("Kept %1: %2").arg(m_chosen).arg(m_reason)
                   : tr("Chose %1 over the largest that fits (%2): %3").arg(m_chosen).arg(m_largest).arg(m_reason);
    else if (!m_candidates.empty())
        text = tr("Timing micro-batch sizes on training micro-batches…");
    else if (m_largestObjective)
        text =
            tr("Nothing timed: the run keeps the largest micro-batch that fits (objective \"largest\", "
               "or only one size to choose from).");
    else
        text = tr("After the probe, the sizes timed for speed appear here.");
    m_caption->setText(text);
}

void SpeedChart::refresh(bool follow) {
    std::vector<Candidate> counted;
    for (const Candidate& c : m_candidates)
        if (c.repetitions > 0) counted.push_back(c);
    std::sort(counted.begin(), counted.end(),
              [](const Candidate& a, const Candidate& b) { return a.microBatch < b.microBatch; });
    QList<QPointF> points;
    QList<QPointF> chosen;
    double rateMax = 0;
    for (const Candidate& c : counted) {
        const QPointF p(static_cast<double>(c.microBatch), c.samplesPerSecond);
        points.append(p);
        if (c.microBatch == m_chosen) chosen.append(p);
        rateMax = std::max(rateMax, c.samplesPerSecond);
    }
    m_line->replace(points);
    m_points->replace(points);
    m_chosenPoint->replace(chosen);
    const double top = std::max(rateMax * 1.1, 1.0);
    if (m_largest > 0)
        m_largestLine->replace(
            {QPointF(static_cast<double>(m_largest), 0), QPointF(static_cast<double>(m_largest), top)});
    else
        m_largestLine->clear();
    if (follow) {
        const double xMax =
            std::max<double>(static_cast<double>(m_largest), counted.empty() ? 1.0 : counted.back().microBatch);
        setPaddedRange(xAxis(), 0, std::max(xMax, 4.0), /*fromZero=*/true);
        setPaddedRange(m_rateAxis, 0, top, /*fromZero=*/true);
    }
}

void SpeedChart::applyColors(const ChartColors& c) {
    m_line->setPen(linePen(c.primary, 1.5));
    m_points->setColor(c.primary);
    m_points->setBorderColor(c.primary.darker(130));
    m_chosenPoint->setColor(c.secondary);  // apart from the timed points' colour
    m_chosenPoint->setBorderColor(c.secondary.darker(140));
    m_largestLine->setPen(linePen(c.limit, 1.5, Qt::DashLine));
    m_rateAxis->setLabelFormat(QStringLiteral("%.0f"));
}

}  // namespace batchpilot::ui
