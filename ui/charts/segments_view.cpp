#include "ui/charts/segments_view.h"

#include <algorithm>

#include <QComboBox>
#include <QEvent>
#include <QFontMetrics>
#include <QHBoxLayout>
#include <QHelpEvent>
#include <QLabel>
#include <QPainter>
#include <QScrollArea>
#include <QToolTip>
#include <QVBoxLayout>

#include "core/base/byte_size.h"

namespace batchpilot::ui {

namespace {

constexpr int kMargin = 8;
constexpr int kLabelWidth = 150;
constexpr int kRowHeight = 18;
constexpr int kRowGap = 5;
constexpr int kMinBarWidth = 24;

QString bytes(int64_t value) {
    return QString::fromStdString(core::formatBytes(value));
}

QString segmentName(const core::SegmentView& segment) {
    const QString pool = segment.smallPool ? SegmentsView::tr("small") : SegmentsView::tr("large");
    return segment.expandable ? SegmentsView::tr("%1, expandable").arg(pool) : pool;
}

}  // namespace

SegmentsView::SegmentsView(QWidget* parent)
    : QWidget(parent),
      m_choice(new QComboBox),
      m_summary(new QLabel),
      m_scroll(new QScrollArea),
      m_map(new SegmentMap) {
    m_choice->setObjectName(QStringLiteral("segmentStates"));
    m_choice->setToolTip(
        tr("The allocator's segments after the latest step, or as they were at an OOM "
           "(each OOM's state is kept)"));
    m_summary->setObjectName(QStringLiteral("segmentsSummary"));
    m_summary->setWordWrap(true);
    m_summary->setTextFormat(Qt::RichText);
    m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_map->setObjectName(QStringLiteral("segmentMap"));
    m_scroll->setWidget(m_map);
    m_scroll->setWidgetResizable(true);
    m_scroll->setFrameShape(QFrame::NoFrame);
    auto* top = new QHBoxLayout;
    top->addWidget(new QLabel(tr("Show")));
    top->addWidget(m_choice, 1);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    layout->addLayout(top);
    layout->addWidget(m_summary);
    layout->addWidget(m_scroll, 1);
    connect(m_choice, &QComboBox::activated, this, [this](int index) { showState(index); });
    refresh();
}

void SegmentsView::handle(const core::Event& event) {
    if (const auto* oom = std::get_if<core::OomEvent>(&event)) {
        m_lastOom = *oom;
        m_haveOom = true;
        return;
    }
    const auto* segments = std::get_if<core::AllocatorSegments>(&event);
    if (segments == nullptr) return;
    if (segments->atOom) {
        OomState state{*segments, m_haveOom ? m_lastOom : core::OomEvent{}};
        m_haveOom = false;
        if (static_cast<int>(m_ooms.size()) == kMaxOomStates) {
            m_ooms.erase(m_ooms.begin());
            ++m_oomsDropped;
            // A frozen OOM that was picked stays picked.
            if (m_choice->currentIndex() > 1) m_choice->setCurrentIndex(m_choice->currentIndex() - 1);
        }
        m_ooms.push_back(std::move(state));
    } else {
        m_latestOf.assign(1, *segments);
    }
    refresh();
}

void SegmentsView::clear() {
    m_latestOf.clear();
    m_ooms.clear();
    m_oomsDropped = 0;
    m_haveOom = false;
    m_choice->clear();
    refresh();
}

void SegmentsView::setDarkTheme(bool dark) {
    m_map->setDarkTheme(dark);
}

int SegmentsView::stateCount() const {
    return 1 + static_cast<int>(m_ooms.size());
}

int SegmentsView::shownIndex() const {
    return std::max(0, m_choice->currentIndex());
}

const core::AllocatorSegments* SegmentsView::shown() const {
    const int index = shownIndex();
    if (index == 0) return m_latestOf.empty() ? nullptr : &m_latestOf.front();
    return index <= static_cast<int>(m_ooms.size()) ? &m_ooms[index - 1].segments : nullptr;
}

QString SegmentsView::stateName(int index) const {
    if (index == 0) {
        return m_latestOf.empty() ? tr("Latest (none yet)") : tr("Latest: after step %1").arg(m_latestOf.front().step);
    }
    const OomState& state = m_ooms[index - 1];
    const QString kind = state.segments.fragmentation ? tr("fragmentation") : tr("exhaustion");
    const int number = m_oomsDropped + index;
    if (state.oom.microBatch > 0) {
        return tr("OOM %1: step %2, %3, micro-batch %4 — %5")
            .arg(number)
            .arg(state.oom.step)
            .arg(QString::fromLatin1(core::toString(state.oom.phase)))
            .arg(state.oom.microBatch)
            .arg(kind);
    }
    return tr("OOM %1: after step %2 — %3").arg(number).arg(state.segments.step).arg(kind);
}

void SegmentsView::showState(int index) {
    if (index < 0 || index >= stateCount()) return;
    m_choice->setCurrentIndex(index);
    const core::AllocatorSegments* state = shown();
    m_map->setState(state);
    m_summary->setText(summaryText());
}

QString SegmentsView::summaryText() const {
    const core::AllocatorSegments* state = shown();
    if (state == nullptr) {
        return tr(
            "No segments yet. They are shown for a virtual GPU, which models PyTorch's caching allocator: a "
            "GPU preset (virtual:T4) or a budget (virtual:512MiB). The CPU and a budget with /exact "
            "(virtual:512MiB/exact) count bytes one by one, without segments.");
    }
    const int64_t reserved = state->reservedBytes();
    const int64_t allocated = state->allocatedBytes();
    int64_t largestCached = 0;
    for (const core::SegmentView& segment : state->segments)
        for (const core::BlockView& block : segment.blocks)
            if (!block.allocated && block.mapped) largestCached = std::max(largestCached, block.bytes);
    QString text =
        tr("%1 reserved in %2 segments of a limit of %3: %4 allocated in blocks, %5 cached (largest "
           "cached block %6).")
            .arg(bytes(reserved))
            .arg(state->segments.size())
            .arg(bytes(state->limitBytes), bytes(allocated), bytes(reserved - allocated), bytes(largestCached));
    if (!state->atOom) return text;
    const int64_t free = std::max<int64_t>(0, state->limitBytes - reserved);
    const QString failed =
        tr("a tensor of %1 found no cached block that large (the largest is %2), and a new "
           "segment of %3 did not fit in the %4 left under the limit")
            .arg(bytes(state->requestedBytes), bytes(largestCached), bytes(state->segmentBytes), bytes(free));
    if (state->fragmentation) {
        text += tr(" <b>Fragmentation</b>: %1, though %2 was cached: enough memory, not in one piece. Try "
                   "expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF, or after the device's name) or a smaller "
                   "micro-batch.")
                    .arg(failed, bytes(reserved - allocated));
    } else {
        text += tr(" <b>Exhaustion</b>: %1; tensors hold nearly all of it: the micro-batch is too large for this "
                   "device.")
                    .arg(failed);
    }
    return text;
}

void SegmentsView::refresh() {
    // Entries are renamed and added in place (an open list stays open); the choice stays: the
    // latest keeps refreshing, an OOM's state stays frozen.
    const int current = m_choice->currentIndex();
    while (m_choice->count() > stateCount()) m_choice->removeItem(m_choice->count() - 1);
    for (int i = 0; i < stateCount(); ++i) {
        if (i < m_choice->count())
            m_choice->setItemText(i, stateName(i));
        else
            m_choice->addItem(stateName(i));
    }
    showState(current < 0 ? 0 : std::min(current, stateCount() - 1));
}

SegmentMap::SegmentMap(QWidget* parent) : QWidget(parent) {
    setMouseTracking(true);
    setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Preferred);
}

QColor SegmentMap::allocatedColor(bool dark) {
    return dark ? QColor(0x4f, 0xa3, 0xf7) : QColor(0x1f, 0x5f, 0xbf);
}

QColor SegmentMap::cachedColor(bool dark) {
    return dark ? QColor(0x3f, 0x6b, 0x4a) : QColor(0xc8, 0xe6, 0xc9);
}

void SegmentMap::setState(const core::AllocatorSegments* state) {
    m_state = state;
    layoutRows();
    updateGeometry();
    update();
}

void SegmentMap::setDarkTheme(bool dark) {
    m_dark = dark;
    update();
}

QSize SegmentMap::sizeHint() const {
    const int rows = m_state == nullptr ? 1 : static_cast<int>(m_state->segments.size()) + (m_state->atOom ? 2 : 0);
    return {600,
            2 * kMargin + rows * (kRowHeight + kRowGap) + 24 + (m_state != nullptr && m_state->atOom ? kRowHeight : 0)};
}

double SegmentMap::rightColumnWidth() const {
    return QFontMetrics(font()).horizontalAdvance(
               tr("%1 used, %2 cached").arg(QStringLiteral("888.8 MiB"), QStringLiteral("888.8 MiB"))) +
           16;
}

void SegmentMap::resizeEvent(QResizeEvent* event) {
    QWidget::resizeEvent(event);
    layoutRows();
}

void SegmentMap::layoutRows() {
    m_segmentRects.clear();
    m_blockRects.clear();
    m_triedRect = {};
    if (m_state == nullptr) return;
    int64_t scale = m_state->atOom ? m_state->segmentBytes : 0;
    for (const core::SegmentView& segment : m_state->segments) scale = std::max(scale, segment.bytes);
    for (const core::SegmentView& segment : m_state->segments)
        for (const core::BlockView& block : segment.blocks) scale = std::max(scale, block.offset + block.bytes);
    if (scale <= 0) return;
    const double left = kMargin + kLabelWidth;
    const double room = std::max(40.0, width() - left - kMargin - rightColumnWidth());  // what is in use, on the right
    const auto widthOf = [&](int64_t n) {
        return std::max<double>(kMinBarWidth, room * static_cast<double>(n) / static_cast<double>(scale));
    };
    double y = kMargin + 18;  // a line for the legend
    for (const core::SegmentView& segment : m_state->segments) {
        // An expandable segment's bar spans its mapped and unmapped pages; bytes counts the mapped.
        int64_t span = segment.bytes;
        for (const core::BlockView& block : segment.blocks) span = std::max(span, block.offset + block.bytes);
        const QRectF bar(left, y, widthOf(span), kRowHeight);
        m_segmentRects.push_back(bar);
        std::vector<QRectF> blocks;
        for (const core::BlockView& block : segment.blocks) {
            const double x0 = bar.left() + bar.width() * static_cast<double>(block.offset) / static_cast<double>(span);
            const double x1 =
                bar.left() + bar.width() * static_cast<double>(block.offset + block.bytes) / static_cast<double>(span);
            blocks.emplace_back(x0, y, x1 - x0, kRowHeight);
        }
        m_blockRects.push_back(std::move(blocks));
        y += kRowHeight + kRowGap;
    }
    if (m_state->atOom && m_state->segmentBytes > 0)
        m_triedRect = QRectF(left, y + kRowGap, widthOf(m_state->segmentBytes), kRowHeight);
}

QRectF SegmentMap::segmentRect(int segment) const {
    return segment >= 0 && segment < static_cast<int>(m_segmentRects.size()) ? m_segmentRects[segment] : QRectF();
}

QRectF SegmentMap::blockRect(int segment, int block) const {
    if (segment < 0 || segment >= static_cast<int>(m_blockRects.size())) return {};
    const auto& blocks = m_blockRects[segment];
    return block >= 0 && block < static_cast<int>(blocks.size()) ? blocks[block] : QRectF();
}

QString SegmentMap::toolTipAt(const QPointF& pos) const {
    if (m_state == nullptr) return {};
    if (m_triedRect.contains(pos)) {
        return tr("The segment the failed allocation tried to reserve: %1, for a tensor of %2")
            .arg(bytes(m_state->segmentBytes), bytes(m_state->requestedBytes));
    }
    for (size_t s = 0; s < m_blockRects.size(); ++s) {
        const core::SegmentView& segment = m_state->segments[s];
        for (size_t b = 0; b < m_blockRects[s].size(); ++b) {
            if (!m_blockRects[s][b].contains(pos)) continue;
            const core::BlockView& block = segment.blocks[b];
            QString text =
                tr("Segment %1 (%2 pool, %3): block at offset %4, %5")
                    .arg(s + 1)
                    .arg(segmentName(segment), bytes(segment.bytes), bytes(block.offset), bytes(block.bytes));
            if (block.allocated)
                text += tr("\nallocated: a tensor asked for %1").arg(bytes(block.requestedBytes));
            else if (!block.mapped)
                text += tr("\nnot mapped: the expandable segment's pages reserve nothing");
            else
                text += tr("\ncached: free, kept for the next tensor that fits in it");
            return text;
        }
    }
    return {};
}

bool SegmentMap::event(QEvent* event) {
    if (event->type() == QEvent::ToolTip) {
        auto* help = static_cast<QHelpEvent*>(event);
        const QString text = toolTipAt(help->pos());
        if (text.isEmpty())
            QToolTip::hideText();
        else
            QToolTip::showText(help->globalPos(), text, this);
        return true;
    }
    return QWidget::event(event);
}

void SegmentMap::paintEvent(QPaintEvent*) {
    QPainter p(this);
    const QColor text = palette().color(QPalette::WindowText);
    const QColor outline = m_dark ? QColor(0xcc, 0xcc, 0xcc) : QColor(0x55, 0x55, 0x55);
    const QColor allocated = allocatedColor(m_dark);
    const QColor cached = cachedColor(m_dark);
    const QColor oom = m_dark ? QColor(0xf8, 0x71, 0x71) : QColor(0xc6, 0x28, 0x28);
    if (m_state == nullptr) return;
    const QFontMetrics metrics(font());
    // Legend.
    double x = kMargin;
    const double legendY = kMargin;
    for (const auto& [color, name] :
         {std::pair{allocated, tr("allocated block")}, std::pair{cached, tr("cached (free)")}}) {
        p.fillRect(QRectF(x, legendY + 3, 12, 10), color);
        p.setPen(text);
        p.drawText(QPointF(x + 16, legendY + 12), name);
        x += 16 + metrics.horizontalAdvance(name) + 16;
    }
    p.setPen(QPen(outline, 1, Qt::DashLine));
    p.drawRect(QRectF(x, legendY + 3, 12, 10));
    p.setPen(text);
    p.drawText(QPointF(x + 16, legendY + 12), tr("not mapped (expandable)"));

    for (size_t s = 0; s < m_segmentRects.size(); ++s) {
        const core::SegmentView& segment = m_state->segments[s];
        const QRectF bar = m_segmentRects[s];
        p.setPen(text);
        p.drawText(QRectF(kMargin, bar.top(), kLabelWidth - 6, bar.height()), Qt::AlignVCenter | Qt::AlignLeft,
                   tr("%1 · %2").arg(segmentName(segment), bytes(segment.bytes)));
        for (size_t b = 0; b < segment.blocks.size(); ++b) {
            const core::BlockView& block = segment.blocks[b];
            const QRectF r = m_blockRects[s][b];
            if (!block.mapped) {
                p.setPen(QPen(outline, 1, Qt::DashLine));
                p.setBrush(Qt::NoBrush);
                p.drawRect(r.adjusted(0.5, 0.5, -0.5, -0.5));
                continue;
            }
            p.fillRect(r, block.allocated ? allocated : cached);
            // A thin gap between neighbours, where there is room to see it.
            if (b > 0 && r.width() >= 3) p.fillRect(QRectF(r.left(), r.top(), 1, r.height()), palette().window());
        }
        p.setPen(QPen(outline, 1));
        p.setBrush(Qt::NoBrush);
        p.drawRect(bar);
        p.setPen(text);
        const int64_t used = segment.allocatedBytes();
        p.drawText(QRectF(bar.right() + 8, bar.top(), rightColumnWidth(), bar.height()),
                   Qt::AlignVCenter | Qt::AlignLeft,
                   tr("%1 used, %2 cached").arg(bytes(used), bytes(segment.bytes - used)));
    }
    if (!m_triedRect.isEmpty()) {
        p.setPen(QPen(oom, 2, Qt::DashLine));
        p.setBrush(Qt::NoBrush);
        p.drawRect(m_triedRect);
        p.setPen(oom);
        p.drawText(QRectF(kMargin, m_triedRect.top(), kLabelWidth - 6, m_triedRect.height()),
                   Qt::AlignVCenter | Qt::AlignLeft, tr("tried · %1").arg(bytes(m_state->segmentBytes)));
        // What it means, under the outline: the outline may be as wide as the widget.
        p.drawText(
            QRectF(m_triedRect.left(), m_triedRect.bottom() + 2, width() - m_triedRect.left() - kMargin, kRowHeight),
            Qt::AlignVCenter | Qt::AlignLeft,
            m_state->fragmentation
                ? tr("fragmentation: no cached block this large, and no room under the limit for a new segment")
                : tr("exhaustion: no room under the limit for a new segment, and no cached block this large"));
    }
}

}  // namespace batchpilot::ui
