#pragma once

#include <map>
#include <string>
#include <vector>

#include <QWidget>

#include "core/events/events.h"
#include "core/records/run_history.h"
#include "ui/charts/live_chart.h"
#include "ui/charts/series_store.h"

class QComboBox;
class QLabel;
class QLineSeries;
class QPushButton;
class QTableWidget;

namespace batchpilot::ui {

/// The curves of several runs in one chart: the live run (from its events, drawn on top) and the
/// runs ticked in the runs list, each in its own colour, as training loss, validation loss or
/// validation accuracy against the optimizer step, the samples seen (fair when target batches
/// differ) or wall time.
class CompareChart : public LiveChart {
    Q_OBJECT
public:
    enum class Metric { TrainLoss = 0, ValidationLoss = 1, ValidationAccuracy = 2 };
    enum class XAxis { Step = 0, Samples = 1, WallTime = 2 };
    struct Run {
        QString name;
        core::RunCurves curves;
    };

    /// Points kept per curve, the live run's and each overlay's: more than a chart has pixel
    /// columns, and few enough to redraw every curve whole.
    static constexpr std::size_t kCurvePoints = 4096;

    explicit CompareChart(QWidget* parent = nullptr);
    void handle(const core::Event& event) override;
    void clear() override;
    bool timeAxis() const override { return m_x == XAxis::WallTime; }

    /// The runs to draw besides the live one (replaces the previous set).
    void setRuns(std::vector<Run> runs);
    void setMetric(Metric metric);
    void setXAxis(XAxis axis);
    XAxis xAxisKind() const { return m_x; }
    /// The points drawn for overlay `index` (0: the first of setRuns) on the current metric and x.
    std::vector<QPointF> overlayPoints(std::size_t index) const;
    /// The live run's points on the current metric and x.
    std::vector<QPointF> livePoints() const;
    std::size_t overlayCount() const { return m_runs.size(); }

protected:
    void refresh(bool follow) override;
    void applyColors(const ChartColors& colors) override;

private:
    const std::vector<core::CurvePoint>& curve(const core::RunCurves& curves) const;
    std::vector<QPointF> points(const std::vector<core::CurvePoint>& curve) const;
    void rebuildSeries();
    QString axisTitle() const;

    core::RunCurves m_live;
    /// The live run's curves, kept to kCurvePoints each (a run of a million steps is drawn at that).
    core::BoundedCurve m_liveTrain{m_live.trainLoss, kCurvePoints};
    core::BoundedCurve m_liveValLoss{m_live.valLoss, kCurvePoints};
    core::BoundedCurve m_liveValAccuracy{m_live.valAccuracy, kCurvePoints};
    std::vector<Run> m_runs;
    std::vector<QLineSeries*> m_series;  ///< one per run, then the live run's last (on top)
    QLineSeries* m_liveSeries = nullptr;
    QAbstractAxis* m_yAxis = nullptr;
    QComboBox* m_metricCombo = nullptr;
    QComboBox* m_xCombo = nullptr;
    Metric m_metric = Metric::TrainLoss;
    XAxis m_x = XAxis::Samples;
};

/// The "Compare runs" tab: every run folder under the runs directory (name, started, model,
/// data, target batch, steps, best validation accuracy, final training loss, state; sortable by
/// any column), a tick per run to overlay its curves in a CompareChart with the live run, and
/// Refresh, Rename and Delete. The live run's folder cannot be renamed or deleted.
class RunsPanel : public QWidget {
    Q_OBJECT
public:
    explicit RunsPanel(QWidget* parent = nullptr);

    /// Where the runs are (empty: core::defaultRunsDirectory()); lists them again.
    void setRunsDirectory(const QString& directory);
    /// The folder the live run writes (it cannot be renamed or deleted while it runs).
    void setLiveFolder(const QString& folder) { m_liveFolder = folder; }
    /// Reads the runs directory again, keeping the ticks of runs still there.
    void refresh();
    /// Ticks or unticks the run in `folder`; the chart follows.
    void setCompared(const QString& folder, bool on);
    bool renameRun(const QString& folder, const QString& name);
    bool deleteRun(const QString& folder);

    QTableWidget* table() const { return m_table; }
    CompareChart* chart() const { return m_chart; }
    /// The folders listed, in the table's current order.
    QStringList folders() const;
    /// The last error (a rename or delete refused), empty when none.
    QString errorText() const { return m_error; }

private:
    void updateChart();
    QString selectedFolder() const;
    int rowOf(const QString& folder) const;

    QString m_runsDirectory;
    QString m_liveFolder;
    QString m_error;
    std::map<std::string, core::RunCurves> m_curves;  ///< read once per folder (a finished run does not change)
    QTableWidget* m_table = nullptr;
    CompareChart* m_chart = nullptr;
    QLabel* m_status = nullptr;
    bool m_filling = false;
};

}  // namespace batchpilot::ui
