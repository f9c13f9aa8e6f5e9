#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include <QColor>
#include <QList>
#include <QPen>
#include <QPointF>
#include <QScatterSeries>
#include <QValueAxis>

#include "ui/charts/thinning.h"

namespace batchpilot::ui {

/// Colours shared by the charts, picked to read well on the light and the dark chart theme.
struct ChartColors {
    QColor primary;    ///< main line (smoothed loss, allocated memory, throughput)
    QColor secondary;  ///< second line (peak memory, micro-batch)
    QColor tertiary;   ///< third line (reserved memory, accumulation steps)
    QColor faint;      ///< raw data under a smoothed line
    QColor fit;        ///< probe trial that fit
    QColor tight;      ///< probe trial that fit but went past the headroom line
    QColor oom;        ///< out of memory
    QColor limit;      ///< capacity line
    QColor headroom;   ///< usable-memory line
    QColor chosen;     ///< chosen micro-batch
    /// Several devices: the other ranks' lanes, in turn (never empty); apart from the blue, orange
    /// and purple of the main lines and the green, amber and red of the probe's outcomes.
    QList<QColor> ranks;

    /// The colour of rank `rank`'s lane.
    QColor rank(int rank) const { return ranks[static_cast<int>(static_cast<unsigned>(rank) % ranks.size())]; }

    static ChartColors forTheme(bool dark);
};

/// A pen for a chart line: `color`, `width` pixels, `style`.
QPen linePen(const QColor& color, qreal width, Qt::PenStyle style = Qt::SolidLine);

/// The three markers of probe trials, named for the legend, the same in every chart: fit (circle),
/// fit but past the headroom line (triangle), out of memory (square). The caller adds them to
/// its chart, which owns them from then on.
struct TrialMarkers {
    QScatterSeries* fits;
    QScatterSeries* tight;
    QScatterSeries* ooms;

    static TrialMarkers create();
    /// Fills each marker with its colour and a darker border.
    void applyColors(const ChartColors& colors) const;
    /// Several devices, another rank's trials: filled with the rank's colour, each outcome's
    /// colour as a thick border (the shapes stay those of the outcomes).
    void applyRankColors(const ChartColors& colors, int rank) const;

    /// Shows every trial at `pointOf(trial)` with the marker of its outcome (trials have `fit`
    /// and `withinHeadroom`).
    template <typename Trials, typename PointOf>
    void show(const Trials& trials, PointOf pointOf) const {
        QList<QPointF> fitPoints, tightPoints, oomPoints;
        for (const auto& t : trials) {
            const QPointF p = pointOf(t);
            (!t.fit ? oomPoints : t.withinHeadroom ? fitPoints : tightPoints).append(p);
        }
        fits->replace(fitPoints);
        tight->replace(tightPoints);
        ooms->replace(oomPoints);
    }
    /// The same, at most about two markers of each outcome per pixel column of the `columns`
    /// between xMin and xMax: each column's lowest and highest (thinMinMax), so that a run with
    /// 100,000 trials draws a few thousand markers, not one graphics item per trial.
    template <typename Trials, typename PointOf>
    void show(const Trials& trials, PointOf pointOf, double xMin, double xMax, int columns) const {
        std::vector<QPointF> points[3];
        for (const auto& t : trials) points[!t.fit ? 2 : t.withinHeadroom ? 0 : 1].push_back(pointOf(t));
        QScatterSeries* const series[3] = {fits, tight, ooms};
        for (int kind = 0; kind < 3; ++kind) {
            const std::vector<QPointF> shown = thinnedByX(std::move(points[kind]), xMin, xMax, columns);
            series[kind]->replace(QList<QPointF>(shown.begin(), shown.end()));
        }
    }
};

/// The item drawn nearest to `point` (chart coordinates), distances measured in fractions of
/// each axis' range so both axes count alike; nullptr when `items` is empty.
template <typename Items, typename PointOf>
const typename Items::value_type* nearestOnChart(const Items& items, PointOf pointOf, const QPointF& point,
                                                 const QValueAxis* x, const QValueAxis* y) {
    const typename Items::value_type* best = nullptr;
    double bestDistance = std::numeric_limits<double>::infinity();
    const double xSpan = std::max(x->max() - x->min(), 1e-9);
    const double ySpan = std::max(y->max() - y->min(), 1e-9);
    for (const auto& item : items) {
        const QPointF p = pointOf(item);
        const double dx = (p.x() - point.x()) / xSpan;
        const double dy = (p.y() - point.y()) / ySpan;
        const double distance = dx * dx + dy * dy;
        if (distance < bestDistance) {
            bestDistance = distance;
            best = &item;
        }
    }
    return best;
}

}  // namespace batchpilot::ui
