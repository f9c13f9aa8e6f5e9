#pragma once

#include <vector>

#include <QColor>
#include <QRectF>
#include <QString>
#include <QWidget>

#include "core/events/events.h"

class QComboBox;
class QLabel;
class QScrollArea;

namespace batchpilot::ui {

class SegmentMap;

/// The "Segments" tab: the caching allocator's memory as PyTorch's memory_viz draws its allocator
/// state — each segment a bar, to scale, with its allocated blocks filled and its cached (free)
/// blocks pale, so that fragmentation shows: a cache full of pieces none of which holds the next
/// request. Refreshed from the AllocatorSegments events after each step; every OOM's state is
/// kept, frozen, and can be picked from the list above the bars, with what failed (the segment
/// tried, drawn to the same scale) and whether it was exhaustion or fragmentation.
///
/// Thread rules: GUI thread only.
class SegmentsView : public QWidget {
    Q_OBJECT
public:
    explicit SegmentsView(QWidget* parent = nullptr);

    /// Takes AllocatorSegments (and the OomEvent before each one at an OOM); ignores the rest.
    void handle(const core::Event& event);
    void clear();
    void setDarkTheme(bool dark);

    /// The states the list offers: 0 the latest, then one per OOM in the order they happened.
    int stateCount() const;
    /// Shows state `index` of the list (what picking it in the list does).
    void showState(int index);
    int shownIndex() const;
    /// The state shown; null before any arrived.
    const core::AllocatorSegments* shown() const;
    /// The line above the bars: reserved, allocated, cached and the limit; at an OOM, what failed.
    QString summaryText() const;
    /// The list's entry for state `index` ("Latest: after step 4", "OOM 1: step 2, micro-batch 171 — fragmentation").
    QString stateName(int index) const;
    /// The painted bars (tests read where each block is drawn).
    SegmentMap* map() const { return m_map; }

    /// At most this many OOM states are kept (the latest ones); a run that keeps failing does not grow memory.
    static constexpr int kMaxOomStates = 64;

private:
    void refresh();

    struct OomState {
        core::AllocatorSegments segments;
        core::OomEvent oom;  ///< the OOM it belongs to (default when none was seen)
    };
    std::vector<core::AllocatorSegments> m_latestOf;  ///< one element: the latest state (empty before any)
    std::vector<OomState> m_ooms;
    int m_oomsDropped = 0;
    core::OomEvent m_lastOom;
    bool m_haveOom = false;
    QComboBox* m_choice;
    QLabel* m_summary;
    QScrollArea* m_scroll;
    SegmentMap* m_map;
};

/// The bars of one allocator state, a row per segment, all to one scale (the largest segment, or
/// the segment an OOM tried when it is larger).
class SegmentMap : public QWidget {
    Q_OBJECT
public:
    explicit SegmentMap(QWidget* parent = nullptr);

    /// The state to draw (null: none); at an OOM the segment it tried is drawn as a dashed
    /// outline below the others. The caller keeps `state` alive while it is shown.
    void setState(const core::AllocatorSegments* state);
    void setDarkTheme(bool dark);

    /// Where block `block` of segment `segment` is drawn (empty when not drawn).
    QRectF blockRect(int segment, int block) const;
    /// The bar of segment `segment`.
    QRectF segmentRect(int segment) const;
    /// The outline of the segment an OOM tried (empty when none).
    QRectF triedRect() const { return m_triedRect; }
    /// Tooltip for the block under `pos`: its segment, size, what was requested or that it is cached.
    QString toolTipAt(const QPointF& pos) const;
    static QColor allocatedColor(bool dark);
    static QColor cachedColor(bool dark);

    QSize sizeHint() const override;

protected:
    bool event(QEvent* event) override;
    void paintEvent(QPaintEvent* event) override;
    void resizeEvent(QResizeEvent* event) override;

private:
    void layoutRows();
    /// Room on the right of the bars for "… used, … cached".
    double rightColumnWidth() const;

    const core::AllocatorSegments* m_state = nullptr;
    bool m_dark = false;
    std::vector<QRectF> m_segmentRects;
    std::vector<std::vector<QRectF>> m_blockRects;
    QRectF m_triedRect;
};

}  // namespace batchpilot::ui
