#pragma once

#include <span>
#include <vector>

#include <QPointF>

namespace batchpilot::ui {

/// Reduces points sorted by x to what a chart `columns` pixels wide can show: for every pixel
/// column between `xMin` and `xMax`, the point with the lowest and the one with the highest y, in
/// x order (so at most about two points per column, and spikes survive). One point on each side
/// of the range is kept so lines run to the plot edge. Columns with one point keep it as is.
std::vector<QPointF> thinMinMax(std::span<const QPointF> points, double xMin, double xMax, int columns);

/// Points in any order, as thinMinMax leaves them: sorted by x first when there are more than two
/// per column; fewer are returned as they are.
std::vector<QPointF> thinnedByX(std::vector<QPointF> points, double xMin, double xMax, int columns);

}  // namespace batchpilot::ui
