#pragma once

#include <cstddef>
#include <vector>

#include <QPointF>

namespace batchpilot::ui {

/// Full-resolution history of one chart series, bounded in memory.
///
/// Points are appended in non-decreasing x order. While fewer than `capacity` points have been
/// stored, every point is kept as it came. When the store fills up, neighbouring groups are
/// merged into their minimum and maximum (kept in x order), which halves the size and doubles the
/// number of raw points each stored pair stands for; later points are grouped the same way. So a
/// million samples stay cheap, and a spike anywhere in the history is never lost.
///
/// Thread rules: use from one thread (the GUI thread).
class SeriesStore {
public:
    explicit SeriesStore(std::size_t capacity = 100000);

    void append(double x, double y);
    void append(const QPointF& point) { append(point.x(), point.y()); }
    void clear();

    /// Stored points in x order (decimated history plus the open group).
    const std::vector<QPointF>& points() const;
    std::size_t size() const { return points().size(); }
    bool isEmpty() const { return m_rawCount == 0; }
    std::size_t capacity() const { return m_capacity; }
    /// Raw points appended since the last clear().
    std::size_t rawCount() const { return m_rawCount; }
    /// Raw points each stored min/max pair stands for (1 until the first decimation).
    std::size_t groupSize() const { return m_groupSize; }
    /// True when the stored points are exactly the raw points.
    bool isFullResolution() const { return m_groupSize == 1; }

    double minX() const { return m_minX; }
    double maxX() const { return m_maxX; }
    double minY() const { return m_minY; }
    double maxY() const { return m_maxY; }
    /// The most recent raw point.
    QPointF last() const { return m_last; }

private:
    void flushGroup();
    void decimate();

    std::size_t m_capacity;
    std::size_t m_groupSize = 1;
    std::size_t m_rawCount = 0;
    std::vector<QPointF> m_points;
    // Open group of raw points not yet reduced to min/max (only when m_groupSize > 1).
    std::size_t m_groupCount = 0;
    QPointF m_groupMin;
    QPointF m_groupMax;
    mutable std::vector<QPointF> m_view;  // m_points plus the open group, rebuilt on demand
    mutable bool m_viewDirty = true;
    double m_minX = 0, m_maxX = 0, m_minY = 0, m_maxY = 0;
    QPointF m_last;
};

}  // namespace batchpilot::ui
