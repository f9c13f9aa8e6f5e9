#include "ui/charts/thinning.h"

#include <algorithm>
#include <cmath>

namespace batchpilot::ui {

std::vector<QPointF> thinMinMax(std::span<const QPointF> points, double xMin, double xMax, int columns) {
    std::vector<QPointF> out;
    if (points.empty()) return out;
    columns = std::max(columns, 1);
    const auto byX = [](const QPointF& p, double x) { return p.x() < x; };
    auto begin = std::lower_bound(points.begin(), points.end(), xMin, byX);
    auto end =
        std::upper_bound(points.begin(), points.end(), xMax, [](double x, const QPointF& p) { return x < p.x(); });
    if (begin != points.begin()) --begin;  // the point left of the range, so the line reaches the left edge
    if (end != points.end()) ++end;
    const auto count = static_cast<std::size_t>(end - begin);
    if (count <= static_cast<std::size_t>(columns) * 2 || !(xMax > xMin)) {
        out.assign(begin, end);
        return out;
    }

    out.reserve(static_cast<std::size_t>(columns) * 2 + 4);
    const double scale = columns / (xMax - xMin);
    const auto columnOf = [&](double x) { return static_cast<long long>(std::floor((x - xMin) * scale)); };
    auto it = begin;
    while (it != end) {
        const long long column = columnOf(it->x());
        QPointF lo = *it;
        QPointF hi = *it;
        auto next = it + 1;
        while (next != end && columnOf(next->x()) == column) {
            if (next->y() < lo.y()) lo = *next;
            if (next->y() > hi.y()) hi = *next;
            ++next;
        }
        if (lo == hi) {
            out.push_back(lo);
        } else if (lo.x() <= hi.x()) {
            out.push_back(lo);
            out.push_back(hi);
        } else {
            out.push_back(hi);
            out.push_back(lo);
        }
        it = next;
    }
    return out;
}

std::vector<QPointF> thinnedByX(std::vector<QPointF> points, double xMin, double xMax, int columns) {
    if (points.size() <= static_cast<std::size_t>(std::max(columns, 1)) * 2) return points;
    std::stable_sort(points.begin(), points.end(), [](const QPointF& a, const QPointF& b) { return a.x() < b.x(); });
    return thinMinMax(points, xMin, xMax, columns);
}

}  // namespace batchpilot::ui
