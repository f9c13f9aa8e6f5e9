#include "ui/charts/memory_breakdown_bar.h"

#include <algorithm>

#include <QEvent>
#include <QFontMetrics>
#include <QHelpEvent>
#include <QLocale>
#include <QPainter>
#include <QToolTip>

#include "core/base/byte_size.h"
#include "core/plan/memory_report.h"

namespace batchpilot::ui {

namespace {

constexpr int kMargin = 6;
constexpr int kBarWidth = 22;
constexpr int kLegendGap = 10;
constexpr int kSwatch = 10;

/// One word for a part, for the legend when there is room for one line per part only.
QString shortName(const QString& name) {
    if (name.startsWith(QLatin1String("optimizer"))) return MemoryBreakdownBar::tr("optimizer");
    if (name.startsWith(QLatin1String("other resident"))) return MemoryBreakdownBar::tr("resident");
    if (name.startsWith(QLatin1String("allocator cache"))) return MemoryBreakdownBar::tr("cache");
    if (name.startsWith(QLatin1String("other processes"))) return MemoryBreakdownBar::tr("processes");
    if (name.startsWith(QLatin1String("CUDA context"))) return MemoryBreakdownBar::tr("context");
    const qsizetype paren = name.indexOf(QLatin1String(" ("));
    return paren > 0 ? name.left(paren) : name;
}

QString mibText(qint64 bytes) {
    return MemoryBreakdownBar::tr("%1 MiB").arg(core::toMiB(bytes), 0, 'f', 2);
}

}  // namespace

MemoryBreakdownBar::MemoryBreakdownBar(QWidget* parent) : QWidget(parent) {
    setMouseTracking(true);
    setSizePolicy(QSizePolicy::Fixed, QSizePolicy::Expanding);
    setToolTip(tr("Where the device memory goes; appears after the run's setup"));
}

QSize MemoryBreakdownBar::sizeHint() const {
    return {190, 260};
}

QSize MemoryBreakdownBar::minimumSizeHint() const {
    return {190, 160};
}

void MemoryBreakdownBar::handle(const core::Event& event) {
    if (const auto* breakdown = std::get_if<core::MemoryBreakdown>(&event)) setBreakdown(*breakdown);
}

void MemoryBreakdownBar::setBreakdown(const core::MemoryBreakdown& breakdown) {
    m_breakdown = breakdown;
    m_have = true;
    m_segments.clear();
    for (const core::MemoryPart& part : core::memoryParts(breakdown))
        m_segments.append({QString::fromStdString(part.name), part.bytes, QString::fromStdString(part.explanation)});
    layoutSegments();
    update();
}

void MemoryBreakdownBar::clear() {
    m_breakdown = {};
    m_have = false;
    m_segments.clear();
    m_segmentRects.clear();
    m_legendRects.clear();
    update();
}

void MemoryBreakdownBar::setDarkTheme(bool dark) {
    m_dark = dark;
    update();
}

qint64 MemoryBreakdownBar::scaleBytes() const {
    qint64 sum = 0;
    for (const Segment& s : m_segments) sum += s.bytes;
    return std::max<qint64>({1, m_breakdown.totalBytes, sum});
}

QColor MemoryBreakdownBar::colorOf(int index) const {
    const QString& name = m_segments[index].name;
    struct Entry {
        const char* prefix;
        QColor light;
        QColor dark;
    };
    static const Entry entries[] = {
        {"parameters", QColor(0x1f, 0x5f, 0xbf), QColor(0x4f, 0xa3, 0xf7)},
        {"gradients", QColor(0x7b, 0x3f, 0xc4), QColor(0xb3, 0x8c, 0xf2)},
        {"optimizer", QColor(0x0f, 0x8b, 0x8d), QColor(0x35, 0xc0, 0xc2)},
        {"activations", QColor(0xd9, 0x73, 0x06), QColor(0xf2, 0xa3, 0x3a)},
        {"input batch", QColor(0xc2, 0x41, 0x0c), QColor(0xfb, 0x92, 0x3c)},
        {"buffer copies", QColor(0xa1, 0x62, 0x07), QColor(0xfa, 0xcc, 0x15)},
        {"other resident", QColor(0x8c, 0x6d, 0x46), QColor(0xc0, 0x9a, 0x6b)},
        {"allocator cache", QColor(0x9f, 0xb7, 0xd9), QColor(0x5d, 0x7a, 0xa3)},
        {"other processes", QColor(0x6b, 0x6b, 0x6b), QColor(0x9a, 0x9a, 0x9a)},
        {"CUDA context", QColor(0x6b, 0x6b, 0x6b), QColor(0x9a, 0x9a, 0x9a)},
        {"free", QColor(0xe9, 0xec, 0xef), QColor(0x3a, 0x3d, 0x42)},
    };
    for (const Entry& e : entries)
        if (name.startsWith(QLatin1String(e.prefix))) return m_dark ? e.dark : e.light;
    return m_dark ? QColor(0x80, 0x80, 0x80) : QColor(0xa0, 0xa0, 0xa0);
}

void MemoryBreakdownBar::resizeEvent(QResizeEvent* event) {
    QWidget::resizeEvent(event);
    layoutSegments();
}

void MemoryBreakdownBar::layoutSegments() {
    m_segmentRects.clear();
    m_legendRects.clear();
    const QFontMetrics fm(font());
    const int top = kMargin + fm.height() + 4;
    m_barRect = QRectF(kMargin + 4, top, kBarWidth, std::max(20, height() - top - kMargin));
    const double scale = m_barRect.height() / static_cast<double>(scaleBytes());
    double y = m_barRect.bottom();
    for (const Segment& s : std::as_const(m_segments)) {
        const double h = static_cast<double>(s.bytes) * scale;
        m_segmentRects.append(QRectF(m_barRect.left(), y - h, m_barRect.width(), h));
        y -= h;
    }
    // Legend: top to bottom in the order the bar stacks them from the top, two lines per entry
    // (name; size and share) when there is room, one otherwise; then capacity and usable.
    const double left = m_barRect.right() + kLegendGap;
    const double width = std::max(20.0, this->width() - left - kMargin);
    const int entries = static_cast<int>(m_segments.size()) + 2;
    const double available = height() - top - kMargin;
    const double twoLines = 2 * fm.height() + 3;
    const double entryHeight = available >= entries * twoLines ? twoLines : fm.height() + 2;
    for (int i = 0; i < m_segments.size(); ++i) m_legendRects.append(QRectF());
    double ly = top;
    for (int i = static_cast<int>(m_segments.size()) - 1; i >= 0; --i) {
        m_legendRects[i] = QRectF(left, ly, width, entryHeight);
        ly += entryHeight;
    }
}

int MemoryBreakdownBar::segmentAt(const QPoint& pos) const {
    for (int i = 0; i < m_segmentRects.size(); ++i) {
        // A segment of a few bytes is still reachable through its legend entry.
        if (m_segmentRects[i].contains(pos) || m_legendRects.value(i).contains(pos)) return i;
    }
    return -1;
}

QPoint MemoryBreakdownBar::segmentCenter(int index) const {
    return m_segmentRects.value(index).center().toPoint();
}

QString MemoryBreakdownBar::segmentToolTip(int index) const {
    if (index < 0 || index >= m_segments.size()) return {};
    const Segment& s = m_segments[index];
    const double share =
        100.0 * static_cast<double>(s.bytes) / static_cast<double>(std::max<qint64>(1, m_breakdown.totalBytes));
    return tr("<b>%1</b>: %2 (%3 bytes, %4% of %5)<br>%6")
        .arg(s.name.toHtmlEscaped(), mibText(s.bytes), QLocale().toString(s.bytes))
        .arg(share, 0, 'f', 1)
        .arg(QString::fromStdString(core::formatBytes(m_breakdown.totalBytes)), s.explanation.toHtmlEscaped());
}

bool MemoryBreakdownBar::event(QEvent* event) {
    if (event->type() == QEvent::ToolTip) {
        auto* help = static_cast<QHelpEvent*>(event);
        const int index = segmentAt(help->pos());
        if (index >= 0) {
            const QRect area = m_segmentRects[index].contains(help->pos()) ? m_segmentRects[index].toAlignedRect()
                                                                           : m_legendRects[index].toAlignedRect();
            QToolTip::showText(help->globalPos(), segmentToolTip(index), this, area);
        } else if (!toolTip().isEmpty()) {
            QToolTip::showText(help->globalPos(), toolTip(), this);
        } else {
            QToolTip::hideText();
        }
        return true;
    }
    return QWidget::event(event);
}

void MemoryBreakdownBar::paintEvent(QPaintEvent*) {
    QPainter p(this);
    p.setRenderHint(QPainter::Antialiasing);
    const QColor text = palette().color(QPalette::WindowText);
    QColor muted = text;
    muted.setAlphaF(0.7f);
    const QFontMetrics fm(font());

    QFont bold = font();
    bold.setBold(true);
    p.setFont(bold);
    p.setPen(text);
    const QString title =
        m_have ? (m_breakdown.step > 0 ? tr("Memory at step %1").arg(m_breakdown.step) : tr("Memory after setup"))
               : tr("Memory breakdown");
    p.drawText(QRectF(kMargin, kMargin, width() - 2 * kMargin, fm.height()), Qt::AlignLeft | Qt::AlignVCenter,
               QFontMetrics(bold).elidedText(title, Qt::ElideRight, width() - 2 * kMargin));
    p.setFont(font());

    const QColor outline = m_dark ? QColor(0x90, 0x90, 0x90) : QColor(0x50, 0x50, 0x50);
    if (!m_have) {
        p.setPen(QPen(outline, 1, Qt::DashLine));
        p.drawRect(m_barRect);
        p.setPen(muted);
        const double left = m_barRect.right() + kLegendGap;
        p.drawText(QRectF(left, m_barRect.top(), width() - left - kMargin, m_barRect.height()),
                   Qt::AlignLeft | Qt::AlignTop | Qt::TextWordWrap,
                   tr("Appears once the run has set up its model on the device."));
        return;
    }

    for (int i = 0; i < m_segments.size(); ++i) {
        p.fillRect(m_segmentRects[i], colorOf(i));
    }
    p.setPen(QPen(outline, 1));
    p.setBrush(Qt::NoBrush);
    p.drawRect(m_barRect);

    // Capacity (solid) and usable (dashed) across the bar, reaching a little past its sides.
    const double scale = m_barRect.height() / static_cast<double>(scaleBytes());
    const auto lineAt = [&](qint64 bytes) { return m_barRect.bottom() - static_cast<double>(bytes) * scale; };
    const QColor limit = m_dark ? QColor(0xe0, 0xe0, 0xe0) : QColor(0x20, 0x20, 0x20);
    const QColor oom = m_dark ? QColor(0xff, 0x5c, 0x5c) : QColor(0xd6, 0x27, 0x28);
    if (m_breakdown.capacityBytes > 0) {
        const double y = lineAt(m_breakdown.capacityBytes);
        p.setPen(QPen(limit, 2));
        p.drawLine(QPointF(m_barRect.left() - 5, y), QPointF(m_barRect.right() + 5, y));
    }
    if (m_breakdown.usableBytes > 0) {
        const double y = lineAt(m_breakdown.usableBytes);
        p.setPen(QPen(oom, 1.5, Qt::DashLine));
        p.drawLine(QPointF(m_barRect.left() - 5, y), QPointF(m_barRect.right() + 5, y));
    }

    // Legend.
    const double total = static_cast<double>(std::max<qint64>(1, m_breakdown.totalBytes));
    for (int i = 0; i < m_segments.size(); ++i) {
        const QRectF r = m_legendRects[i];
        const Segment& s = m_segments[i];
        const QRectF swatch(r.left(), r.top() + (fm.height() - kSwatch) / 2.0, kSwatch, kSwatch);
        p.fillRect(swatch, colorOf(i));
        p.setPen(QPen(outline, 1));
        p.drawRect(swatch);
        const double textLeft = r.left() + kSwatch + 5;
        const int textWidth = static_cast<int>(r.right() - textLeft);
        const QString size = tr("%1 MiB · %2%")
                                 .arg(core::toMiB(s.bytes), 0, 'f', 1)
                                 .arg(100.0 * static_cast<double>(s.bytes) / total, 0, 'f', 0);
        if (r.height() >= 2 * fm.height()) {
            p.setPen(text);
            p.drawText(QPointF(textLeft, r.top() + fm.ascent()), fm.elidedText(s.name, Qt::ElideRight, textWidth));
            p.setPen(muted);
            p.drawText(QPointF(textLeft, r.top() + fm.height() + fm.ascent()),
                       fm.elidedText(size, Qt::ElideRight, textWidth));
        } else {
            const QString sizeShort = tr("%1 MiB").arg(core::toMiB(s.bytes), 0, 'f', 1);
            const int sizeWidth = fm.horizontalAdvance(sizeShort);
            p.setPen(text);
            p.drawText(QPointF(textLeft, r.top() + fm.ascent()),
                       fm.elidedText(shortName(s.name), Qt::ElideRight, std::max(10, textWidth - sizeWidth - 4)));
            p.setPen(muted);
            p.drawText(QPointF(r.right() - sizeWidth, r.top() + fm.ascent()), sizeShort);
        }
    }
    // The two lines' legend entries below the parts.
    double y = m_legendRects.isEmpty() ? m_barRect.top() : m_legendRects.front().bottom();
    for (int i = 0; i < m_legendRects.size(); ++i) y = std::max(y, m_legendRects[i].bottom());
    y += 4;
    const double left = m_barRect.right() + kLegendGap;
    const int textWidth = static_cast<int>(width() - left - kMargin - 18);
    const QList<std::tuple<QPen, QString>> lines = {
        {QPen(limit, 2), tr("capacity %1").arg(mibText(m_breakdown.capacityBytes))},
        {QPen(oom, 1.5, Qt::DashLine), tr("usable %1").arg(mibText(m_breakdown.usableBytes))},
    };
    for (const auto& [pen, label] : lines) {
        if (y + fm.height() > height()) break;
        p.setPen(pen);
        const double mid = y + fm.height() / 2.0;
        p.drawLine(QPointF(left, mid), QPointF(left + 12, mid));
        p.setPen(text);
        p.drawText(QPointF(left + 17, y + fm.ascent()), fm.elidedText(label, Qt::ElideRight, textWidth));
        y += fm.height() + 2;
    }
}

}  // namespace batchpilot::ui
