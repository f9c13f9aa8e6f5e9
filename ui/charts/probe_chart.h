#pragma once

#include <vector>

#include <QList>
#include <QPair>

#include "ui/charts/chart_style.h"
#include "ui/charts/live_chart.h"

class QComboBox;
class QLineSeries;
class QValueAxis;
class QScatterSeries;

namespace batchpilot::ui {

/// Probe: every trial as a point (micro-batch size against trial number or time), fits as green
/// circles, fits past the headroom line as amber triangles, out-of-memory trials as red squares;
/// the trials of each probe joined by a faint line, and the chosen micro-batch as a dashed step
/// line. Every re-probe is a new sequence further right. With several devices the chosen line is
/// rank 0's (this window trains it), and each other rank has a lane in a colour of its own: its
/// trials (the outcomes' shapes, filled with the rank's colour; they arrive with the step they
/// happened in, RankProbed) and the micro-batch it trained at in each step, as a step line.
class ProbeChart : public LiveChart {
    Q_OBJECT
public:
    enum class XAxis { Trial = 0, WallTime = 1 };

    explicit ProbeChart(QWidget* parent = nullptr);

    void handle(const core::Event& event) override;
    bool timeAxis() const override { return m_xKind == XAxis::WallTime; }
    void clear() override;
    QStringList dataSeries() const override {
        return {QStringLiteral("probe_fit_peak_bytes"), QStringLiteral("probe_oom_micro_batch")};
    }
    void setXAxis(XAxis axis);

    /// Trials shown, of every rank.
    int trialCount() const { return static_cast<int>(m_trials.size()); }
    /// Probe sequences seen (started), of every rank; 1 after the first probe of a one-device run.
    int sequenceCount() const { return static_cast<int>(m_sequences.size()); }
    /// Several devices: rank `rank`'s trials drawn so far, as (micro-batch, fit), in order.
    QList<QPair<qint64, bool>> rankTrials(int rank) const;
    /// Micro-batch chosen by the last finished probe, 0 before.
    qint64 chosenMicroBatch() const;
    /// Several devices: the other ranks' lanes.
    int rankLaneCount() const { return static_cast<int>(m_rankLanes.size()); }
    /// The micro-batch rank `rank` trained at in the last step it reported; 0 without a lane.
    qint64 rankMicroBatch(int rank) const;
    /// The steps at which rank `rank`'s micro-batch changed (its first step included).
    QList<qint64> rankChangeSteps(int rank) const;
    /// The legend's name of rank `rank`'s lane (empty when it has none).
    QString rankLaneName(int rank) const;

protected:
    void refresh(bool follow) override;
    void applyColors(const ChartColors& colors) override;

private:
    struct Trial {
        int rank = 0;
        int sequence = 0;
        int globalIndex = 0;  // 1-based across all probes of the run
        int trial = 0;
        double time = 0;
        qint64 microBatch = 0;
        bool fit = false;
        bool withinHeadroom = false;
        qint64 peakBytes = 0;
        qint64 failedBytes = 0;
    };
    struct Sequence {
        int rank = 0;
        int number = 0;
        QString reason;
        QString device;
        int firstGlobal = 0;  // global index of its first trial
        double startTime = 0;
        qint64 chosen = 0;  // 0 until finished
        int finishedGlobal = 0;
        double finishedTime = 0;
    };
    /// Where a rank's micro-batch changed (and where it was last reported).
    struct LanePoint {
        double time = 0;
        double trialX = 0;  // on the trial axis: after the trials of rank 0 so far
        qint64 microBatch = 0;
        qint64 step = 0;
    };
    struct RankLane {
        int rank = 0;
        QString device;
        std::vector<LanePoint> changes;
        LanePoint last;
        QLineSeries* series = nullptr;
        TrialMarkers trials{};  // its probe trials
    };
    RankLane& laneOf(int rank, const QString& device);
    /// Rank `rank`'s probe `number` (the latest of that number), added when not seen yet.
    Sequence& sequenceOf(int rank, int number, double time);
    void addTrial(int rank, const core::ProbeTrial& trial);
    void finishSequence(int rank, const core::ProbeFinished& finished);
    double xOf(const Trial& trial) const;
    /// Where a trial is drawn: (trial number or time, micro-batch).
    QPointF pointOf(const Trial& trial) const;
    const Trial* nearestTrial(const QPointF& point) const;
    QString describe(const Trial& trial) const;

    static constexpr int kMaxPathSeries = 16;
    static constexpr std::size_t kMaxTrials = 100000;

    XAxis m_xKind = XAxis::Trial;
    std::vector<Trial> m_trials;
    std::vector<Sequence> m_sequences;
    std::vector<RankLane> m_rankLanes;
    double m_lastTime = 0;

    QScatterSeries* m_fits = nullptr;
    QScatterSeries* m_tight = nullptr;
    QScatterSeries* m_ooms = nullptr;
    QLineSeries* m_chosen = nullptr;
    QList<QLineSeries*> m_paths;
    // Linear: QLogValueAxis and QCategoryAxis in Qt 6.4 elide their labels to "…" once their
    // range changes after the chart is shown.
    QValueAxis* m_yAxis = nullptr;
    QComboBox* m_xCombo = nullptr;
};

}  // namespace batchpilot::ui
