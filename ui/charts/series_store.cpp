#include "ui/charts/series_store.h"

#include <algorithm>

namespace batchpilot::ui {

SeriesStore::SeriesStore(std::size_t capacity) : m_capacity(std::max<std::size_t>(capacity, 16)) {
    m_points.reserve(std::min<std::size_t>(m_capacity, 4096));
}

void SeriesStore::clear() {
    m_points.clear();
    m_view.clear();
    m_viewDirty = true;
    m_groupSize = 1;
    m_groupCount = 0;
    m_rawCount = 0;
    m_minX = m_maxX = m_minY = m_maxY = 0;
    m_last = {};
}

void SeriesStore::append(double x, double y) {
    const QPointF p(x, y);
    if (m_rawCount == 0) {
        m_minX = m_maxX = x;
        m_minY = m_maxY = y;
    } else {
        m_minX = std::min(m_minX, x);
        m_maxX = std::max(m_maxX, x);
        m_minY = std::min(m_minY, y);
        m_maxY = std::max(m_maxY, y);
    }
    ++m_rawCount;
    m_last = p;
    m_viewDirty = true;

    if (m_groupSize == 1) {
        m_points.push_back(p);
    } else {
        if (m_groupCount == 0) {
            m_groupMin = m_groupMax = p;
        } else {
            if (y < m_groupMin.y()) m_groupMin = p;
            if (y > m_groupMax.y()) m_groupMax = p;
        }
        if (++m_groupCount == m_groupSize) flushGroup();
    }
    if (m_points.size() >= m_capacity) decimate();
}

void SeriesStore::flushGroup() {
    if (m_groupCount == 0) return;
    // Keep min and max in the order they happened so the drawn line stays monotonic in x.
    if (m_groupMin.x() <= m_groupMax.x()) {
        m_points.push_back(m_groupMin);
        m_points.push_back(m_groupMax);
    } else {
        m_points.push_back(m_groupMax);
        m_points.push_back(m_groupMin);
    }
    m_groupCount = 0;
}

void SeriesStore::decimate() {
    // Every run of four stored points (two groups, or four raw points at the first decimation)
    // becomes its min and max. The stored size halves and each pair now stands for twice as many
    // raw points as before.
    std::vector<QPointF> merged;
    merged.reserve(m_points.size() / 2 + 2);
    std::size_t i = 0;
    for (; i + 4 <= m_points.size(); i += 4) {
        auto first = m_points.begin() + static_cast<std::ptrdiff_t>(i);
        auto last = first + 4;
        auto [lo, hi] =
            std::minmax_element(first, last, [](const QPointF& a, const QPointF& b) { return a.y() < b.y(); });
        if (lo->x() <= hi->x()) {
            merged.push_back(*lo);
            merged.push_back(*hi);
        } else {
            merged.push_back(*hi);
            merged.push_back(*lo);
        }
    }
    for (; i < m_points.size(); ++i) merged.push_back(m_points[i]);
    m_points.swap(merged);
    m_groupSize *= 2;
}

const std::vector<QPointF>& SeriesStore::points() const {
    if (m_groupCount == 0) return m_points;
    if (m_viewDirty) {
        m_view = m_points;
        if (m_groupMin.x() <= m_groupMax.x()) {
            m_view.push_back(m_groupMin);
            if (m_groupMax != m_groupMin) m_view.push_back(m_groupMax);
        } else {
            m_view.push_back(m_groupMax);
            m_view.push_back(m_groupMin);
        }
        m_viewDirty = false;
    }
    return m_view;
}

}  // namespace batchpilot::ui
