#pragma once

#include <QImage>
#include <QList>
#include <QWidget>

#include "core/events/events.h"

class QTabWidget;
class QTimer;

namespace batchpilot::ui {

class GpuPlanPanel;
class LiveChart;
class LossChart;
class MemoryBreakdownBar;
class MemoryChart;
class MemoryFitChart;
class SpeedChart;
class ProbeChart;
class RunsPanel;
class SegmentsView;
class ThroughputChart;

/// The tabs: "Live" with the four live charts in a grid and the memory breakdown bar next to the
/// memory chart, "Memory fit" with the latest probe's memory against micro-batch and its
/// what-if slider, the fastest micro-batch's timings, the runs to compare, the allocator's
/// segments and the plan on every GPU preset. Charts redraw one at a time on a 16 ms timer (each ~15 Hz).
/// Everything outside ui/charts/ talks to the charts through this class, so Qt Charts stays swappable.
class ChartsPanel : public QWidget {
    Q_OBJECT
public:
    explicit ChartsPanel(QWidget* parent = nullptr);

    /// Passes an event to every chart (cheap: charts only store it; drawing waits for the timer).
    void handle(const core::Event& event);
    void clear();
    /// The run's target batch (from the RunModel), for the memory-fit tab's what-if plan.
    void setTargetBatch(qint64 target);
    /// Redraws every chart whose data or range changed now (the timer does it otherwise).
    void redrawNow();
    /// Redraws the next chart that has new data (round robin): one chart per timer tick keeps
    /// each pass of the event loop short while every chart still updates ~15 times a second.
    void redrawNext();
    void setFollowLive(bool follow);
    bool followLive() const;
    void setDarkTheme(bool dark);
    /// Saves the four live charts, the speed chart, the memory fit and the breakdown bar as
    /// `<directory>/<name>.png`; returns the files written, and those that could not be in `failed`.
    QStringList exportAll(const QString& directory, QStringList* failed = nullptr);

    LossChart* lossChart() const { return m_loss; }
    ProbeChart* probeChart() const { return m_probe; }
    MemoryChart* memoryChart() const { return m_memory; }
    ThroughputChart* throughputChart() const { return m_throughput; }
    MemoryFitChart* memoryFitChart() const { return m_memoryFit; }
    SpeedChart* speedChart() const { return m_speed; }
    MemoryBreakdownBar* breakdownBar() const { return m_breakdownBar; }
    /// The "Compare runs" tab: the runs list and the chart overlaying them with the live run.
    RunsPanel* runsPanel() const { return m_runs; }
    /// The "Segments" tab: the caching allocator's segments, latest and at each OOM.
    SegmentsView* segmentsView() const { return m_segments; }
    /// The "Every GPU" tab: the plan each GPU preset would give, after each probe.
    GpuPlanPanel* gpuPlanPanel() const { return m_gpuPlan; }
    QTabWidget* tabs() const { return m_tabs; }
    /// The four live charts (follow live, Export all charts).
    QList<LiveChart*> charts() const;

    /// Images for the saved report: the loss chart, the memory-fit chart (without its what-if
    /// row) and the breakdown bar, as they look now (drawn even when their tab is hidden).
    QImage lossImage();
    QImage memoryFitImage();
    QImage breakdownImage();

Q_SIGNALS:
    /// Some chart started or stopped following live.
    void followLiveChanged(bool allFollowing);
    /// A chart's menu asked for its data as CSV (LiveChart::exportDataRequested).
    void exportDataRequested(const QStringList& series, const QString& suggestedName);

private:
    /// Every chart the timer redraws: the four live ones, the memory fit and the speed chart.
    QList<LiveChart*> drawnCharts() const;

    LossChart* m_loss;
    ProbeChart* m_probe;
    MemoryChart* m_memory;
    ThroughputChart* m_throughput;
    MemoryFitChart* m_memoryFit;
    SpeedChart* m_speed;
    MemoryBreakdownBar* m_breakdownBar;
    RunsPanel* m_runs;
    SegmentsView* m_segments;
    GpuPlanPanel* m_gpuPlan;
    QTabWidget* m_tabs;
    QTimer* m_timer;
    int m_nextChart = 0;
};

}  // namespace batchpilot::ui
