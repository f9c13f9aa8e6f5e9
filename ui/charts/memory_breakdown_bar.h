#pragma once

#include <QColor>
#include <QList>
#include <QRectF>
#include <QString>
#include <QWidget>

#include "core/events/events.h"

namespace batchpilot::ui {

/// Where the device memory goes at the latest MemoryBreakdown: one vertical bar as tall as the
/// device's whole memory, stacked from the bottom with core::memoryParts() (parameters,
/// gradients, optimizer state, activations, allocator cache and other processes where the device
/// has them, free), a solid capacity marker and a dashed usable (headroom) line across it, and
/// a legend with each part's size. Hovering a segment or its legend entry shows its exact size
/// and what it is.
///
/// Thread rules: GUI thread only.
class MemoryBreakdownBar : public QWidget {
    Q_OBJECT
public:
    /// One stacked part of the bar.
    struct Segment {
        QString name;
        qint64 bytes = 0;
        QString explanation;
    };

    explicit MemoryBreakdownBar(QWidget* parent = nullptr);

    /// Takes MemoryBreakdown events; ignores the rest.
    void handle(const core::Event& event);
    void setBreakdown(const core::MemoryBreakdown& breakdown);
    void clear();
    void setDarkTheme(bool dark);

    bool hasBreakdown() const { return m_have; }
    const core::MemoryBreakdown& breakdown() const { return m_breakdown; }
    /// The parts, bottom to top: memoryParts(), plus "other resident" when the measured peak
    /// holds more than the parts explain, so the segments add up to the device's memory.
    const QList<Segment>& segments() const { return m_segments; }
    /// Index of the segment (bar or legend entry) under `pos`, -1 when none.
    int segmentAt(const QPoint& pos) const;
    /// Centre of segment `index` in the bar, in widget coordinates (tests hover there).
    QPoint segmentCenter(int index) const;
    /// Tooltip of segment `index`: name, exact MiB and share, and the explanation.
    QString segmentToolTip(int index) const;

    QSize sizeHint() const override;
    QSize minimumSizeHint() const override;

protected:
    bool event(QEvent* event) override;
    void paintEvent(QPaintEvent* event) override;
    void resizeEvent(QResizeEvent* event) override;

private:
    void layoutSegments();
    QColor colorOf(int index) const;
    /// Bytes the bar's height stands for: the device's memory, or more when the parts add up
    /// to more (a peak measured past a virtual budget).
    qint64 scaleBytes() const;

    core::MemoryBreakdown m_breakdown;
    bool m_have = false;
    bool m_dark = false;
    QList<Segment> m_segments;
    QRectF m_barRect;
    QList<QRectF> m_segmentRects;
    QList<QRectF> m_legendRects;
};

}  // namespace batchpilot::ui
