#pragma once

#include <functional>

#include <QRectF>
#include <QString>
#include <QStringList>
#include <QWidget>

#include "core/events/events.h"
#include "ui/charts/chart_style.h"

class QAbstractAxis;
class QChart;
class QChartView;
class QHBoxLayout;
class QMenu;
class QToolButton;
class QValueAxis;
class QXYSeries;

namespace batchpilot::ui {

class SeriesStore;

/// Base of the live charts: a Qt Charts view with a small tool row (chart-specific controls,
/// "Follow live", "Export PNG"), zoom (drag a rectangle, or the wheel) and pan (drag with the
/// middle button, or Shift and the left button) that pause following while data keeps arriving,
/// double-click to follow live again, a right-click menu (follow live, export this chart's data as
/// CSV, export it as PNG), hover tooltips, and timer-driven redraws. Subclasses keep their data in
/// SeriesStores, take events in handle(), and draw in refresh() with one replace() per series.
///
/// Thread rules: GUI thread only.
class LiveChart : public QWidget {
    Q_OBJECT
public:
    explicit LiveChart(const QString& title, QWidget* parent = nullptr);
    ~LiveChart() override;

    virtual void handle(const core::Event& event) = 0;
    /// Forgets all data (a new run starts).
    virtual void clear() = 0;

    /// Redraws when data or the visible range changed since the last call. Called by a timer.
    void redraw();
    /// True when data arrived since the last redraw.
    bool isDirty() const { return m_dirty; }
    bool followLive() const { return m_followLive; }
    void setFollowLive(bool follow);
    /// Shows the x range [x0, x1] and the y range [y0, y1] and pauses following, as a user's
    /// rubber-band zoom does.
    void zoomTo(const QRectF& valueRect);
    /// Shows the x range [x0, x1] (y fitted to it) and pauses following, without reporting it as
    /// the user's choice: how the charts panel keeps the wall-time charts' x axes in step.
    void showXRange(double x0, double x1);
    /// True when the x axis is wall time (seconds since the run started) at the moment.
    virtual bool timeAxis() const { return false; }
    /// Saves the chart as it looks now.
    bool exportPng(const QString& path);
    /// The series of the exported table (core/records/series_export.h: "train_loss", "val_loss", …) that
    /// this chart draws; empty: the chart draws none of them (its menu then offers no CSV export).
    virtual QStringList dataSeries() const { return {}; }
    /// The right-click menu, owned by `parent`: Follow live, Export data as CSV…, Export PNG….
    QMenu* createContextMenu(QWidget* parent);
    void setDarkTheme(bool dark);
    QString title() const { return m_title; }

    QChart* chart() const { return m_chart; }
    QChartView* chartView() const { return m_view; }
    QValueAxis* xAxis() const { return m_xAxis; }

Q_SIGNALS:
    void followLiveChanged(bool follow);
    /// The user zoomed or panned this chart to show x in [x0, x1].
    void xRangeChosen(double x0, double x1);
    /// The user asked for this chart's data as CSV (its menu): `series` is dataSeries(),
    /// `suggestedName` a file name for the save dialog.
    void exportDataRequested(const QStringList& series, const QString& suggestedName);

protected:
    /// Row above the chart where subclasses add their controls.
    QHBoxLayout* controls() const { return m_controls; }
    void markDirty() { m_dirty = true; }
    /// Draws the data: when `follow`, fit the axes to all data; otherwise keep the axis ranges
    /// and only thin to them.
    virtual void refresh(bool follow) = 0;
    virtual void applyColors(const ChartColors& colors) = 0;
    const ChartColors& colors() const { return m_colors; }

    /// Pixel columns of the plot area (at least 100).
    int plotColumns() const;
    /// Thins `store` to the x range, applies `transform` to y (if given; it must be monotonic,
    /// e.g. log10) and replaces the series' points in one call; returns the y range of what was
    /// drawn through `yMin`/`yMax` (widened, not reset).
    static void replaceThinned(QXYSeries* series, const SeriesStore& store, double xMin, double xMax, int columns,
                               double* yMin = nullptr, double* yMax = nullptr, double (*transform)(double) = nullptr);
    /// Sets an axis range with a little padding; handles empty and degenerate ranges.
    static void setPaddedRange(QAbstractAxis* axis, double lo, double hi, bool fromZero = false);
    /// Shows a tooltip with `format(point)` while the mouse is over `series`.
    void showTipsFor(QXYSeries* series, std::function<QString(const QPointF&)> format);

private:
    friend class ZoomableChartView;
    void userZoomed();
    /// The title as a file name: "Device memory" -> "device_memory".
    QString fileStem() const;
    void askForPng();

    QString m_title;
    QChart* m_chart = nullptr;
    QChartView* m_view = nullptr;
    QValueAxis* m_xAxis = nullptr;
    QHBoxLayout* m_controls = nullptr;
    QToolButton* m_followButton = nullptr;
    bool m_followLive = true;
    bool m_dirty = true;
    ChartColors m_colors;
};

}  // namespace batchpilot::ui
