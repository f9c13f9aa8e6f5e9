#include "ui/charts/probe_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <QChart>
#include <QComboBox>
#include <QHBoxLayout>
#include <QLegendMarker>
#include <QLineSeries>
#include <QScatterSeries>
#include <QValueAxis>

#include "core/base/byte_size.h"

namespace batchpilot::ui {

namespace {

QString reasonText(core::ProbeReason reason) {
    switch (reason) {
    case core::ProbeReason::Initial: return ProbeChart::tr("start of run");
    case core::ProbeReason::UserRequest: return ProbeChart::tr("re-probe requested");
    case core::ProbeReason::DeviceSwitch: return ProbeChart::tr("device switch");
    case core::ProbeReason::TargetBatchChange: return ProbeChart::tr("target batch change");
    case core::ProbeReason::Regrow: return ProbeChart::tr("trying to grow after OOM");
    case core::ProbeReason::MemorySavers: return ProbeChart::tr("memory savers turned on");
    }
    return {};
}

QString bytes(qint64 value) {
    return QString::fromStdString(core::formatBytes(value));
}

}  // namespace

ProbeChart::ProbeChart(QWidget* parent) : LiveChart(tr("Probe: micro-batch trials"), parent) {
    m_yAxis = new QValueAxis;
    m_yAxis->setTitleText(tr("samples"));  // short: Qt elides a title longer than the plot is high
    m_yAxis->setLabelFormat(QStringLiteral("%.0f"));
    chart()->addAxis(m_yAxis, Qt::AlignLeft);
    setPaddedRange(m_yAxis, 0, 64, /*fromZero=*/true);
    xAxis()->setTitleText(tr("trial number"));
    xAxis()->setLabelFormat(QStringLiteral("%d"));

    m_chosen = new QLineSeries;
    m_chosen->setName(tr("chosen"));
    const TrialMarkers markers = TrialMarkers::create();
    m_fits = markers.fits;
    m_tight = markers.tight;
    m_ooms = markers.ooms;
    for (QXYSeries* series : {static_cast<QXYSeries*>(m_chosen), static_cast<QXYSeries*>(m_fits),
                              static_cast<QXYSeries*>(m_tight), static_cast<QXYSeries*>(m_ooms)}) {
        chart()->addSeries(series);
        series->attachAxis(xAxis());
        series->attachAxis(m_yAxis);
    }
    const auto tip = [this](const QPointF& p) {
        const Trial* trial = nearestTrial(p);
        return trial ? describe(*trial) : QString();
    };
    showTipsFor(m_fits, tip);
    showTipsFor(m_tight, tip);
    showTipsFor(m_ooms, tip);
    showTipsFor(m_chosen,
                [](const QPointF& p) { return tr("chosen micro-batch: %1 samples").arg(std::llround(p.y())); });

    m_xCombo = new QComboBox;
    m_xCombo->addItem(tr("Trial number"));
    m_xCombo->addItem(tr("Wall time"));
    m_xCombo->setToolTip(tr("Quantity on the x axis"));
    connect(m_xCombo, &QComboBox::currentIndexChanged, this,
            [this](int index) { setXAxis(static_cast<XAxis>(index)); });
    controls()->addWidget(m_xCombo);
    applyColors(colors());
}

qint64 ProbeChart::chosenMicroBatch() const {
    for (auto it = m_sequences.rbegin(); it != m_sequences.rend(); ++it)
        if (it->chosen > 0) return it->chosen;
    return 0;
}

qint64 ProbeChart::rankMicroBatch(int rank) const {
    for (const RankLane& lane : m_rankLanes)
        if (lane.rank == rank) return lane.last.microBatch;
    return 0;
}

QList<qint64> ProbeChart::rankChangeSteps(int rank) const {
    QList<qint64> steps;
    for (const RankLane& lane : m_rankLanes)
        if (lane.rank == rank)
            for (const LanePoint& p : lane.changes) steps.append(p.step);
    return steps;
}

QList<QPair<qint64, bool>> ProbeChart::rankTrials(int rank) const {
    QList<QPair<qint64, bool>> trials;
    for (const Trial& t : m_trials)
        if (t.rank == rank) trials.append({t.microBatch, t.fit});
    return trials;
}

QString ProbeChart::rankLaneName(int rank) const {
    for (const RankLane& lane : m_rankLanes)
        if (lane.rank == rank) return lane.series->name();
    return {};
}

ProbeChart::RankLane& ProbeChart::laneOf(int rank, const QString& device) {
    for (RankLane& lane : m_rankLanes) {
        if (lane.rank != rank) continue;
        if (lane.device != device) {  // moved by a device switch: the lane is named by where it is now
            lane.device = device;
            lane.series->setName(tr("rank %1 (%2)").arg(rank).arg(device));
        }
        return lane;
    }
    if (m_rankLanes.empty()) m_chosen->setName(tr("chosen · rank 0"));
    RankLane lane;
    lane.rank = rank;
    lane.device = device;
    lane.series = new QLineSeries;
    lane.series->setName(tr("rank %1 (%2)").arg(rank).arg(device));
    chart()->addSeries(lane.series);
    lane.series->attachAxis(xAxis());
    lane.series->attachAxis(m_yAxis);
    lane.series->setPen(linePen(colors().rank(rank), 2.0));
    lane.trials = TrialMarkers::create();
    const auto tip = [this](const QPointF& p) {
        const Trial* trial = nearestTrial(p);
        return trial ? describe(*trial) : QString();
    };
    for (QScatterSeries* markers : {lane.trials.fits, lane.trials.tight, lane.trials.ooms}) {
        chart()->addSeries(markers);
        markers->attachAxis(xAxis());
        markers->attachAxis(m_yAxis);
        markers->setMarkerSize(markers->markerSize() - 1);
        for (QLegendMarker* marker : chart()->legend()->markers(markers))
            marker->setVisible(false);  // the lane's line names it
        showTipsFor(markers, tip);
    }
    lane.trials.applyRankColors(colors(), rank);
    showTipsFor(lane.series, [this, rank](const QPointF& p) {
        // The change at or before the point.
        for (const RankLane& l : m_rankLanes) {
            if (l.rank != rank || l.changes.empty()) continue;
            const LanePoint* at = &l.changes.front();
            for (const LanePoint& c : l.changes)
                if ((m_xKind == XAxis::Trial ? c.trialX : c.time) <= p.x() + 1e-9) at = &c;
            return tr("rank %1 (%2): micro-batch %3 from step %4")
                .arg(rank)
                .arg(l.device)
                .arg(at->microBatch)
                .arg(at->step);
        }
        return QString();
    });
    m_rankLanes.push_back(lane);
    return m_rankLanes.back();
}

double ProbeChart::xOf(const Trial& trial) const {
    return m_xKind == XAxis::Trial ? trial.globalIndex : trial.time;
}

ProbeChart::Sequence& ProbeChart::sequenceOf(int rank, int number, double time) {
    for (auto it = m_sequences.rbegin(); it != m_sequences.rend(); ++it) {
        if (it->rank != rank) continue;
        if (it->number == number) return *it;
        break;  // a rank's probes come one after another: a new number is a new probe
    }
    Sequence s;  // a trial without its start event: still show it
    s.rank = rank;
    s.number = number;
    s.firstGlobal = static_cast<int>(m_trials.size()) + 1;
    s.startTime = time;
    m_sequences.push_back(s);
    return m_sequences.back();
}

void ProbeChart::addTrial(int rank, const core::ProbeTrial& trial) {
    if (m_trials.size() >= kMaxTrials) return;
    sequenceOf(rank, trial.sequence, trial.time);
    Trial t;
    t.rank = rank;
    t.sequence = trial.sequence;
    t.globalIndex = static_cast<int>(m_trials.size()) + 1;
    t.trial = trial.trial;
    t.time = trial.time;
    t.microBatch = trial.microBatch;
    t.fit = trial.fit;
    t.withinHeadroom = trial.withinHeadroom;
    t.peakBytes = trial.peakBytes;
    t.failedBytes = trial.failedAllocationBytes;
    m_trials.push_back(t);
    m_lastTime = std::max(m_lastTime, trial.time);
}

void ProbeChart::finishSequence(int rank, const core::ProbeFinished& finished) {
    Sequence& s = sequenceOf(rank, finished.sequence, finished.time);
    s.chosen = finished.microBatch;
    s.finishedGlobal = static_cast<int>(m_trials.size());
    s.finishedTime = finished.time;
    m_lastTime = std::max(m_lastTime, finished.time);
}

void ProbeChart::handle(const core::Event& event) {
    if (const auto* started = std::get_if<core::ProbeStarted>(&event)) {
        Sequence s;
        s.number = started->sequence;
        s.reason = reasonText(started->reason);
        s.device = QString::fromStdString(started->device);
        s.firstGlobal = static_cast<int>(m_trials.size()) + 1;
        s.startTime = started->time;
        m_sequences.push_back(s);
        m_lastTime = started->time;
        markDirty();
    } else if (const auto* trial = std::get_if<core::ProbeTrial>(&event)) {
        addTrial(0, *trial);
        markDirty();
    } else if (const auto* finished = std::get_if<core::ProbeFinished>(&event)) {
        finishSequence(0, *finished);
        markDirty();
    } else if (const auto* report = std::get_if<core::RankProbed>(&event)) {
        // Another rank's probes, as it ran them in the step that just ended: after rank 0's
        // trials of that step on the trial axis, at their own times on the time axis.
        laneOf(report->rank, QString::fromStdString(report->device));
        for (const core::ProbeStarted& started : report->probes) {
            Sequence& s = sequenceOf(report->rank, started.sequence, started.time);
            s.reason = reasonText(started.reason);
            s.device = QString::fromStdString(started.device);
        }
        for (const core::ProbeTrial& t : report->trials) addTrial(report->rank, t);
        for (const core::ProbeFinished& f : report->finished) finishSequence(report->rank, f);
        m_lastTime = std::max(m_lastTime, report->time);
        markDirty();
    } else if (const auto* ranks = std::get_if<core::RanksStepped>(&event)) {
        for (const core::RankStep& r : ranks->ranks) {
            if (r.rank == 0 || r.microBatch <= 0) continue;  // rank 0: this window's own trials
            RankLane& lane = laneOf(r.rank, QString::fromStdString(r.device));
            const LanePoint point{ranks->time, static_cast<double>(m_trials.size()) + 0.5, r.microBatch, ranks->step};
            if (lane.changes.empty() || lane.changes.back().microBatch != r.microBatch) lane.changes.push_back(point);
            lane.last = point;
        }
        m_lastTime = std::max(m_lastTime, ranks->time);
        markDirty();
    } else if (const auto* metrics = std::get_if<core::StepMetrics>(&event)) {
        m_lastTime = metrics->time;  // the chosen line reaches to "now" on the time axis
        if (m_xKind == XAxis::WallTime) markDirty();
    }
}

void ProbeChart::clear() {
    m_trials.clear();
    m_sequences.clear();
    m_lastTime = 0;
    for (QLineSeries* path : std::as_const(m_paths)) {
        chart()->removeSeries(path);
        delete path;
    }
    m_paths.clear();
    m_fits->clear();
    m_tight->clear();
    m_ooms->clear();
    m_chosen->clear();
    for (const RankLane& lane : m_rankLanes) {
        for (QXYSeries* series :
             std::initializer_list<QXYSeries*>{lane.series, lane.trials.fits, lane.trials.tight, lane.trials.ooms}) {
            chart()->removeSeries(series);
            delete series;
        }
    }
    m_rankLanes.clear();
    m_chosen->setName(tr("chosen"));
    markDirty();
}

void ProbeChart::setXAxis(XAxis axis) {
    if (axis == m_xKind) return;
    m_xKind = axis;
    {
        const QSignalBlocker blocker(m_xCombo);
        m_xCombo->setCurrentIndex(static_cast<int>(axis));
    }
    xAxis()->setTitleText(axis == XAxis::Trial ? tr("trial number") : tr("wall time (s)"));
    xAxis()->setLabelFormat(axis == XAxis::Trial ? QStringLiteral("%d") : QStringLiteral("%g"));
    setFollowLive(true);
    markDirty();
}

void ProbeChart::refresh(bool follow) {
    QList<QPointF> chosen;
    double yMax = 0;
    for (const Trial& t : m_trials) yMax = std::max(yMax, static_cast<double>(t.microBatch));
    const auto trialsOf = [this](int rank) {
        std::vector<Trial> trials;
        for (const Trial& t : m_trials)
            if (t.rank == rank) trials.push_back(t);
        return trials;
    };
    const auto point = [this](const Trial& t) { return pointOf(t); };
    // Every series drawn at most about two points per pixel column of the range shown: a run's
    // trials and probes can number 100,000 (thinMinMax keeps each column's lowest and highest).
    const double now = m_xKind == XAxis::Trial ? static_cast<double>(m_trials.size()) + 0.5 : m_lastTime;
    const double xMin = follow ? 0 : xAxis()->min();
    const double xMax = follow ? std::max(m_xKind == XAxis::Trial ? now : m_lastTime, 4.0) : xAxis()->max();
    const int columns = plotColumns();
    const auto thinned = [&](QList<QPointF> points) {
        const std::vector<QPointF> shown =
            thinnedByX(std::vector<QPointF>(points.begin(), points.end()), xMin, xMax, columns);
        return QList<QPointF>(shown.begin(), shown.end());
    };
    TrialMarkers{m_fits, m_tight, m_ooms}.show(m_rankLanes.empty() ? m_trials : trialsOf(0), point, xMin, xMax,
                                               columns);
    for (const RankLane& lane : m_rankLanes) lane.trials.show(trialsOf(lane.rank), point, xMin, xMax, columns);

    // One faint path per probe so a re-probe reads as a new sequence.
    while (m_paths.size() < std::min<int>(static_cast<int>(m_sequences.size()), kMaxPathSeries)) {
        auto* path = new QLineSeries;
        chart()->addSeries(path);
        path->attachAxis(xAxis());
        path->attachAxis(m_yAxis);
        path->setPen(linePen(colors().headroom, 1.0));
        const auto markers = chart()->legend()->markers(path);
        for (QLegendMarker* marker : markers) marker->setVisible(false);
        m_paths.append(path);
    }
    const std::size_t firstPathSequence =
        m_sequences.size() > static_cast<std::size_t>(kMaxPathSeries) ? m_sequences.size() - kMaxPathSeries : 0;
    for (int i = 0; i < m_paths.size(); ++i) {
        QList<QPointF> points;
        const std::size_t seqIndex = firstPathSequence + static_cast<std::size_t>(i);
        if (seqIndex < m_sequences.size()) {
            const Sequence& sequence = m_sequences[seqIndex];
            for (const Trial& t : m_trials)
                if (t.rank == sequence.rank && t.sequence == sequence.number)
                    points.append(QPointF(xOf(t), static_cast<double>(t.microBatch)));
        }
        m_paths[i]->replace(thinned(points));
    }

    // The chosen micro-batch as a step line: from the end of each probe to the next probe.
    // Rank 0's: the other ranks' micro-batches are their lanes' lines.
    for (std::size_t i = 0; i < m_sequences.size(); ++i) {
        const Sequence& s = m_sequences[i];
        if (s.chosen <= 0 || s.rank != 0) continue;
        const double from = m_xKind == XAxis::Trial ? s.finishedGlobal : s.finishedTime;
        double to = now;
        std::size_t next = i + 1;
        while (next < m_sequences.size() && m_sequences[next].rank != 0) ++next;
        if (next < m_sequences.size())
            to = m_xKind == XAxis::Trial ? m_sequences[next].firstGlobal - 0.5 : m_sequences[next].startTime;
        const double y = static_cast<double>(s.chosen);
        chosen.append(QPointF(from, y));
        chosen.append(QPointF(std::max(from, to), y));
        yMax = std::max(yMax, y);
    }
    m_chosen->replace(thinned(chosen));

    // Each other rank's micro-batch as a step line, to the last step it reported and on to now.
    for (const RankLane& lane : m_rankLanes) {
        const auto x = [this](const LanePoint& p) { return m_xKind == XAxis::Trial ? p.trialX : p.time; };
        QList<QPointF> points;
        for (std::size_t i = 0; i < lane.changes.size(); ++i) {
            const auto y = static_cast<double>(lane.changes[i].microBatch);
            const double to = i + 1 < lane.changes.size() ? x(lane.changes[i + 1]) : std::max(x(lane.last), now);
            points.append(QPointF(x(lane.changes[i]), y));
            points.append(QPointF(to, y));
            yMax = std::max(yMax, y);
        }
        lane.series->replace(thinned(points));
    }

    if (follow) {
        if (m_xKind == XAxis::Trial)
            setPaddedRange(xAxis(), 0, std::max<double>(m_trials.size(), 4), /*fromZero=*/true);
        else
            setPaddedRange(xAxis(), 0, std::max(m_lastTime, 1.0), /*fromZero=*/true);
        setPaddedRange(m_yAxis, 0, std::max(yMax, 4.0), /*fromZero=*/true);
    }
}

QPointF ProbeChart::pointOf(const Trial& t) const {
    return {xOf(t), static_cast<double>(t.microBatch)};
}

const ProbeChart::Trial* ProbeChart::nearestTrial(const QPointF& point) const {
    return nearestOnChart(
        m_trials, [this](const Trial& t) { return pointOf(t); }, point, xAxis(), m_yAxis);
}

QString ProbeChart::describe(const Trial& t) const {
    QString reason;
    QString device;
    for (const Sequence& s : m_sequences) {
        if (s.rank != t.rank || s.number != t.sequence) continue;
        reason = s.reason;
        device = s.device;
    }
    QString text =
        tr("probe %1 (%2), trial %3\nmicro-batch %4: ").arg(t.sequence).arg(reason).arg(t.trial).arg(t.microBatch);
    if (!m_rankLanes.empty()) text.prepend(tr("rank %1 (%2): ").arg(t.rank).arg(device));
    if (!t.fit)
        text += tr("out of memory");
    else if (!t.withinHeadroom)
        text += tr("fits, but past the headroom line");
    else
        text += tr("fits");
    text += tr("\npeak %1").arg(bytes(t.peakBytes));
    if (!t.fit && t.failedBytes > 0) text += tr(", failed allocation %1").arg(bytes(t.failedBytes));
    text += tr("\nat %1 s into the run").arg(t.time, 0, 'f', 2);
    return text;
}

void ProbeChart::applyColors(const ChartColors& c) {
    TrialMarkers{m_fits, m_tight, m_ooms}.applyColors(c);
    m_chosen->setPen(linePen(c.chosen, 2.0, Qt::DashLine));
    for (QLineSeries* path : std::as_const(m_paths)) path->setPen(linePen(c.headroom, 1.0));
    for (const RankLane& lane : m_rankLanes) {
        lane.series->setPen(linePen(c.rank(lane.rank), 2.0));
        lane.trials.applyRankColors(c, lane.rank);
    }
    m_yAxis->setLabelFormat(QStringLiteral("%.0f"));
}

}  // namespace batchpilot::ui
