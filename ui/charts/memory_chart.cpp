#include "ui/charts/memory_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <QBrush>
#include <QChart>
#include <QGraphicsLineItem>
#include <QGraphicsRectItem>
#include <QGraphicsScene>
#include <QLegendMarker>
#include <QLabel>
#include <QLineSeries>
#include <QPen>
#include <QScatterSeries>
#include <QVBoxLayout>
#include <QValueAxis>

#include "core/base/byte_size.h"

namespace batchpilot::ui {

namespace {

double mib(int64_t bytes) {
    return core::toMiB(bytes);
}

QString bytesText(int64_t bytes) {
    return QString::fromStdString(core::formatBytes(bytes));
}

}  // namespace

MemoryChart::MemoryChart(QWidget* parent) : LiveChart(tr("Device memory"), parent) {
    auto* yAxis = new QValueAxis;
    yAxis->setTitleText(tr("MiB"));  // short: Qt elides a title longer than the plot is high
    yAxis->setLabelFormat(QStringLiteral("%.0f"));
    m_yAxis = yAxis;
    chart()->addAxis(m_yAxis, Qt::AlignLeft);
    xAxis()->setTitleText(tr("wall time (s)"));

    m_capacitySeries = new QLineSeries;
    m_capacitySeries->setName(tr("capacity"));
    m_headroomSeries = new QLineSeries;
    m_headroomSeries->setName(tr("usable"));
    m_reservedSeries = new QLineSeries;
    m_reservedSeries->setName(tr("reserved"));
    m_peakSeries = new QLineSeries;
    // Named for what a student sees: the peak is sampled per micro-batch, "allocated" between
    // micro-batches (what stays: parameters, gradients, optimizer state).
    m_peakSeries->setName(tr("peak"));
    m_allocatedSeries = new QLineSeries;
    m_allocatedSeries->setName(tr("resident"));
    m_oomSeries = new QScatterSeries;
    m_oomSeries->setName(tr("OOM"));
    m_oomSeries->setMarkerShape(QScatterSeries::MarkerShapeTriangle);
    m_oomSeries->setMarkerSize(10);
    for (QXYSeries* series : {static_cast<QXYSeries*>(m_capacitySeries), static_cast<QXYSeries*>(m_headroomSeries),
                              static_cast<QXYSeries*>(m_reservedSeries), static_cast<QXYSeries*>(m_peakSeries),
                              static_cast<QXYSeries*>(m_allocatedSeries), static_cast<QXYSeries*>(m_oomSeries)}) {
        chart()->addSeries(series);
        series->attachAxis(xAxis());
        series->attachAxis(m_yAxis);
    }
    m_reservedSeries->setVisible(false);
    for (QLegendMarker* marker : chart()->legend()->markers(m_reservedSeries)) marker->setVisible(false);

    const auto lineTip = [](const QString& name) {
        return [name](const QPointF& p) {
            return tr("%1: %2 MiB at %3 s").arg(name).arg(p.y(), 0, 'f', 1).arg(p.x(), 0, 'f', 1);
        };
    };
    showTipsFor(m_allocatedSeries,
                lineTip(tr("resident between micro-batches (parameters, gradients, optimizer state)")));
    showTipsFor(m_peakSeries, lineTip(tr("peak of the micro-batch (resident + its activations)")));
    showTipsFor(m_reservedSeries, lineTip(tr("reserved")));
    showTipsFor(m_capacitySeries, lineTip(tr("capacity")));
    showTipsFor(m_headroomSeries, lineTip(tr("usable (capacity minus headroom)")));
    showTipsFor(m_oomSeries, [this](const QPointF& p) {
        // The marker nearest in time.
        const Oom* best = nullptr;
        for (const Oom& oom : m_ooms)
            if (!best || std::abs(oom.time - p.x()) < std::abs(best->time - p.x())) best = &oom;
        return best ? best->text : QString();
    });

    // One line, so that it never takes height from the charts above (the full sentence is its
    // tooltip).
    m_caption = new QLabel;
    m_caption->setObjectName(QStringLiteral("memoryCaption"));
    m_caption->setWordWrap(false);
    m_caption->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Fixed);
    m_caption->setContentsMargins(6, 0, 6, 2);
    setCaption(false);
    if (auto* box = qobject_cast<QVBoxLayout*>(layout())) box->addWidget(m_caption);

    // Markers follow the plot when the chart is resized or zoomed.
    connect(chart(), &QChart::plotAreaChanged, this, [this] { placeMarkers(); });
    connect(xAxis(), &QValueAxis::rangeChanged, this, [this] { placeMarkers(); });
    applyColors(colors());
}

MemoryChart::~MemoryChart() = default;

QString MemoryChart::oomText(int index) const {
    return index >= 0 && index < oomMarkerCount() ? m_ooms[static_cast<std::size_t>(index)].text : QString();
}

void MemoryChart::setCaption(bool ranks) {
    const QString tip =
        tr("peak: the most memory each micro-batch (or probe trial) used — what stays resident "
           "plus its activations. resident: what stays allocated between micro-batches — parameters, "
           "gradients and optimizer state.");
    if (!ranks) {
        m_caption->setText(tr("<b>peak</b>: per micro-batch · <b>resident</b>: between them"));
        m_caption->setToolTip(tip);
        return;
    }
    m_caption->setText(tr("<b>peak</b>, <b>resident</b>, capacity: rank 0's · <b>rank N</b>: its peak per step"));
    m_caption->setToolTip(tip + tr("\nSeveral devices: those lines are rank 0's (this window trains it); each "
                                   "other rank's line is its device's peak in each step."));
}

QString MemoryChart::captionText() const {
    return m_caption->text();
}

const SeriesStore* MemoryChart::rankPeaks(int rank) const {
    for (const auto& lane : m_rankLanes)
        if (lane->rank == rank) return &lane->peaks;
    return nullptr;
}

QString MemoryChart::rankLaneName(int rank) const {
    for (const auto& lane : m_rankLanes)
        if (lane->rank == rank) return lane->series->name();
    return {};
}

MemoryChart::RankLane& MemoryChart::laneOf(int rank, const QString& device, double time) {
    for (auto& lane : m_rankLanes) {
        if (lane->rank != rank) continue;
        if (lane->devices.isEmpty() || lane->devices.back().second != device) lane->devices.append({time, device});
        return *lane;
    }
    if (m_rankLanes.empty()) setCaption(true);
    auto lane = std::make_unique<RankLane>();
    lane->rank = rank;
    lane->series = new QLineSeries;
    lane->series->setName(tr("rank %1").arg(rank));  // the legend is narrow; the tooltip names the device
    chart()->addSeries(lane->series);
    lane->series->attachAxis(xAxis());
    lane->series->attachAxis(m_yAxis);
    lane->series->setPen(linePen(colors().rank(rank), 1.6));
    lane->devices.append({time, device});
    showTipsFor(lane->series, [rank, devices = &lane->devices](const QPointF& p) {
        QString device = devices->front().second;  // the one it was on at that time
        for (const auto& [since, name] : *devices)
            if (since <= p.x()) device = name;
        return tr("rank %1 (%2): peak %3 MiB in the step that ended at %4 s")
            .arg(rank)
            .arg(device)
            .arg(p.y(), 0, 'f', 1)
            .arg(p.x(), 0, 'f', 1);
    });
    m_rankLanes.push_back(std::move(lane));
    return *m_rankLanes.back();
}

void MemoryChart::handle(const core::Event& event) {
    if (const auto* sample = std::get_if<core::MemorySample>(&event)) {
        m_allocated.append(sample->time, mib(sample->allocatedBytes));
        m_reserved.append(sample->time, mib(sample->reservedBytes));
        m_peak.append(sample->time, mib(sample->peakBytes));
        m_capacity.append(sample->time, mib(sample->capacityBytes));
        m_headroom.append(sample->time, mib(sample->headroomBytes));
        if (sample->reservedBytes != sample->allocatedBytes && !m_hasCache) {
            m_hasCache = true;
            m_reservedSeries->setVisible(true);
            for (QLegendMarker* marker : chart()->legend()->markers(m_reservedSeries)) marker->setVisible(true);
        }
        markDirty();
    } else if (const auto* oom = std::get_if<core::OomEvent>(&event)) {
        addOom(*oom, QString(), -1);
    } else if (const auto* trial = std::get_if<core::ProbeTrial>(&event)) {
        if (!trial->fit) addOom(*trial, QString(), -1);
    } else if (const auto* report = std::get_if<core::RankProbed>(&event)) {
        RankLane& lane = laneOf(report->rank, QString::fromStdString(report->device), report->time);
        for (const core::ProbeStarted& probe : report->probes) lane.usable = mib(probe.usableBytes);
        const QString who = tr("rank %1 (%2): ").arg(report->rank).arg(QString::fromStdString(report->device));
        for (const core::ProbeTrial& t : report->trials)
            if (!t.fit) addOom(t, who, lane.usable);
        for (const core::OomEvent& o : report->ooms) addOom(o, who, lane.usable);
    } else if (const auto* ranks = std::get_if<core::RanksStepped>(&event)) {
        for (const core::RankStep& r : ranks->ranks) {
            if (r.rank == 0) continue;  // this window's own, drawn in detail above
            laneOf(r.rank, QString::fromStdString(r.device), ranks->time).peaks.append(ranks->time, mib(r.peakBytes));
        }
        markDirty();
    }
}

void MemoryChart::addOom(const core::OomEvent& oom, const QString& who, double level) {
    if (m_ooms.size() >= kMaxOoms) return;
    QString text = who + tr("Out of memory at %1 s, step %2\nphase: %3, micro-batch %4\n")
                             .arg(oom.time, 0, 'f', 2)
                             .arg(oom.step)
                             .arg(QString::fromLatin1(core::toString(oom.phase)))
                             .arg(oom.microBatch);
    text +=
        oom.requestedBytes > 0 ? tr("requested %1").arg(bytesText(oom.requestedBytes)) : tr("requested size unknown");
    if (oom.recovered) text += tr("\nrecovered: replayed the batch at micro-batch %1").arg(oom.newMicroBatch);
    m_ooms.push_back({oom.time, text, level});
    markDirty();
}

void MemoryChart::addOom(const core::ProbeTrial& trial, const QString& who, double level) {
    if (m_ooms.size() >= kMaxOoms) return;
    QString text = who + tr("Out of memory at %1 s (probe %2, trial %3)\nphase: probe trial, "
                            "micro-batch %4\n")
                             .arg(trial.time, 0, 'f', 2)
                             .arg(trial.sequence)
                             .arg(trial.trial)
                             .arg(trial.microBatch);
    text += trial.failedAllocationBytes > 0 ? tr("requested %1").arg(bytesText(trial.failedAllocationBytes))
                                            : tr("requested size unknown");
    m_ooms.push_back({trial.time, text, level});
    markDirty();
}

void MemoryChart::clear() {
    for (SeriesStore* store : {&m_allocated, &m_reserved, &m_peak, &m_capacity, &m_headroom}) store->clear();
    m_ooms.clear();
    for (const auto& lane : m_rankLanes) {
        chart()->removeSeries(lane->series);
        delete lane->series;
    }
    m_rankLanes.clear();
    setCaption(false);
    m_hasCache = false;
    m_reservedSeries->setVisible(false);
    for (QXYSeries* series : {static_cast<QXYSeries*>(m_capacitySeries), static_cast<QXYSeries*>(m_headroomSeries),
                              static_cast<QXYSeries*>(m_reservedSeries), static_cast<QXYSeries*>(m_peakSeries),
                              static_cast<QXYSeries*>(m_allocatedSeries), static_cast<QXYSeries*>(m_oomSeries)})
        series->clear();
    placeMarkers();
    markDirty();
}

void MemoryChart::refresh(bool follow) {
    double x0 = xAxis()->min();
    double x1 = xAxis()->max();
    if (follow) {
        x0 = 0;
        x1 = m_allocated.isEmpty() ? 1 : m_allocated.maxX();
        for (const Oom& oom : m_ooms) x1 = std::max(x1, oom.time);
        for (const auto& lane : m_rankLanes)
            if (!lane->peaks.isEmpty()) x1 = std::max(x1, lane->peaks.maxX());
        setPaddedRange(xAxis(), x0, x1, /*fromZero=*/true);
        x0 = xAxis()->min();
        x1 = xAxis()->max();
    }
    double yMin = 0;
    double yMax = -std::numeric_limits<double>::infinity();
    const int columns = plotColumns();
    replaceThinned(m_allocatedSeries, m_allocated, x0, x1, columns, &yMin, &yMax);
    replaceThinned(m_peakSeries, m_peak, x0, x1, columns, &yMin, &yMax);
    if (m_hasCache) replaceThinned(m_reservedSeries, m_reserved, x0, x1, columns, &yMin, &yMax);
    replaceThinned(m_capacitySeries, m_capacity, x0, x1, columns, &yMin, &yMax);
    replaceThinned(m_headroomSeries, m_headroom, x0, x1, columns, &yMin, &yMax);
    for (const auto& lane : m_rankLanes) replaceThinned(lane->series, lane->peaks, x0, x1, columns, &yMin, &yMax);

    const double capacity = m_capacity.isEmpty() ? 0 : m_capacity.last().y();
    QList<QPointF> oomPoints;
    for (const Oom& oom : m_ooms) {
        oomPoints.append(QPointF(oom.time, oom.level >= 0 ? oom.level : capacity));
        if (oom.level >= 0) yMax = std::max(yMax, oom.level);
    }
    m_oomSeries->replace(oomPoints);

    if (follow) setPaddedRange(m_yAxis, 0, std::isfinite(yMax) ? yMax : 1, /*fromZero=*/true);
    placeMarkers();
}

void MemoryChart::placeMarkers() {
    // Vertical lines through the plot at each OOM's time. Several OOMs in one pixel column share
    // a line; each line carries the tooltip of the last OOM it stands for (the scatter markers
    // on the capacity line carry all of them).
    const QRectF plot = chart()->plotArea();
    const double x0 = xAxis()->min();
    const double x1 = xAxis()->max();
    QList<std::pair<double, const Oom*>> columns;
    double lastPixel = -1e9;
    if (plot.width() > 0 && x1 > x0) {
        for (const Oom& oom : m_ooms) {
            if (oom.time < x0 || oom.time > x1) continue;
            const double px = plot.left() + (oom.time - x0) / (x1 - x0) * plot.width();
            if (px - lastPixel < 2 && !columns.isEmpty()) {
                columns.last().second = &oom;
                continue;
            }
            columns.append({px, &oom});
            lastPixel = px;
        }
    }
    while (m_markerItems.size() < columns.size()) {
        auto* hit = new QGraphicsRectItem;  // wide transparent area, so the tooltip is easy to hit
        hit->setPen(Qt::NoPen);
        hit->setBrush(Qt::transparent);
        hit->setZValue(5);
        auto* line = new QGraphicsLineItem(hit);
        line->setPen(linePen(colors().oom, 1.5));
        chart()->scene()->addItem(hit);
        m_markerItems.append(hit);
    }
    for (int i = 0; i < m_markerItems.size(); ++i) {
        auto* hit = static_cast<QGraphicsRectItem*>(m_markerItems[i]);
        if (i >= columns.size()) {
            hit->setVisible(false);
            continue;
        }
        const double px = columns[i].first;
        hit->setRect(px - 3, plot.top(), 6, plot.height());
        auto* line = static_cast<QGraphicsLineItem*>(hit->childItems().first());
        line->setLine(px, plot.top(), px, plot.bottom());
        line->setPen(linePen(colors().oom, 1.5));
        hit->setToolTip(columns[i].second->text);
        hit->setVisible(true);
    }
}

void MemoryChart::applyColors(const ChartColors& c) {
    m_allocatedSeries->setPen(linePen(c.primary, 2.0));
    m_peakSeries->setPen(linePen(c.secondary, 1.2));
    m_reservedSeries->setPen(linePen(c.tertiary, 1.2));
    m_capacitySeries->setPen(linePen(c.limit, 1.5));
    m_headroomSeries->setPen(linePen(c.headroom, 1.2, Qt::DashLine));
    for (const auto& lane : m_rankLanes) lane->series->setPen(linePen(c.rank(lane->rank), 1.6));
    m_oomSeries->setColor(c.oom);
    m_oomSeries->setBorderColor(c.oom.darker(130));
    if (auto* axis = qobject_cast<QValueAxis*>(m_yAxis)) axis->setLabelFormat(QStringLiteral("%.0f"));
    placeMarkers();
}

}  // namespace batchpilot::ui
