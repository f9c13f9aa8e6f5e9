#include "ui/teaching/micro_batch_table.h"

#include <algorithm>

#include <QHeaderView>
#include <QPainter>
#include <QScrollBar>
#include <QStyledItemDelegate>
#include <QTimer>

namespace batchpilot::ui {

namespace {

/// Indices shown in the cell; the tooltip has them all (up to kTooltipIndices).
constexpr std::size_t kShownIndices = 4;
constexpr std::size_t kTooltipIndices = 4096;

QString decimal(double value) {
    return QString::number(value, 'g', 6);
}

QString indexList(const std::vector<int64_t>& indices, std::size_t count) {
    QStringList parts;
    for (std::size_t i = 0; i < std::min(count, indices.size()); ++i) parts << QString::number(indices[i]);
    return parts.join(QStringLiteral(", "));
}

/// The whole list, sixteen numbers a line, for a tooltip.
QString indexTooltip(const std::vector<int64_t>& indices) {
    QStringList lines;
    QStringList line;
    const std::size_t shown = std::min(indices.size(), kTooltipIndices);
    for (std::size_t i = 0; i < shown; ++i) {
        line << QString::number(indices[i]);
        if (line.size() == 16) {
            lines << line.join(QStringLiteral(", "));
            line.clear();
        }
    }
    if (!line.isEmpty()) lines << line.join(QStringLiteral(", "));
    QString text = MicroBatchTableModel::tr("Dataset samples of this micro-batch (%1):\n%2")
                       .arg(indices.size())
                       .arg(lines.join(QStringLiteral(",\n")));
    if (indices.size() > shown) text += MicroBatchTableModel::tr("\n… and %1 more").arg(indices.size() - shown);
    return text;
}

/// Paints the gradient norm as a bar with its number, and the pending row dashed.
class MicroBatchDelegate : public QStyledItemDelegate {
public:
    using QStyledItemDelegate::QStyledItemDelegate;

    void paint(QPainter* painter, const QStyleOptionViewItem& option, const QModelIndex& index) const override {
        if (index.column() != MicroBatchTableModel::NormColumn) {
            QStyledItemDelegate::paint(painter, option, index);
        } else {
            QStyleOptionViewItem opt = option;
            initStyleOption(&opt, index);
            const QString text = opt.text;
            opt.text.clear();
            const QWidget* widget = opt.widget;
            QStyle* style = widget ? widget->style() : nullptr;
            if (style) style->drawControl(QStyle::CE_ItemViewItem, &opt, painter, widget);
            const double fraction = std::clamp(index.data(MicroBatchTableModel::NormFractionRole).toDouble(), 0.0, 1.0);
            const QRect cell = opt.rect.adjusted(4, 3, -4, -3);
            const int textWidth = opt.fontMetrics.horizontalAdvance(QStringLiteral("0.000000"));
            const QRect barArea(cell.left(), cell.top(), std::max(0, cell.width() - textWidth - 6), cell.height());
            painter->save();
            if (fraction > 0 && barArea.width() > 4) {
                QColor fill = opt.palette.color(QPalette::Highlight);
                fill.setAlpha(170);
                painter->fillRect(QRectF(barArea.left(), barArea.top(), barArea.width() * fraction, barArea.height()),
                                  fill);
                QColor frame = opt.palette.color(QPalette::Mid);
                painter->setPen(frame);
                painter->drawRect(QRectF(barArea).adjusted(0, 0, -0.5, -0.5));
            }
            painter->setPen(opt.palette.color(QPalette::Text));
            painter->drawText(QRect(barArea.right() + 6, cell.top(), textWidth, cell.height()),
                              Qt::AlignRight | Qt::AlignVCenter, text);
            painter->restore();
        }
        if (index.data(MicroBatchTableModel::PendingRole).toBool()) {
            painter->save();
            QColor edge = option.palette.color(QPalette::Highlight);
            painter->setPen(QPen(edge, 1.5, Qt::DashLine));
            const QRectF r = QRectF(option.rect).adjusted(0.75, 0.75, -0.75, -0.75);
            painter->drawLine(r.topLeft(), r.topRight());
            painter->drawLine(r.bottomLeft(), r.bottomRight());
            if (index.column() == 0) painter->drawLine(r.topLeft(), r.bottomLeft());
            if (index.column() == MicroBatchTableModel::ColumnCount - 1)
                painter->drawLine(r.topRight(), r.bottomRight());
            painter->restore();
        }
    }
};

}  // namespace

QString lossWeightText(qint64 size, qint64 target) {
    if (target <= 0) return QString();
    const double weight = static_cast<double>(size) / static_cast<double>(target);
    const QString shown = decimal(weight);
    const bool exact = shown.toDouble() == weight;
    return QStringLiteral("%1/%2 %3 %4")
        .arg(size)
        .arg(target)
        .arg(exact ? QStringLiteral("=") : QStringLiteral("≈"), shown);
}

QString sampleSummary(const std::vector<int64_t>& indices, qint64 offset, qint64 size) {
    if (indices.empty())
        return MicroBatchTableModel::tr("positions %1–%2 of the batch").arg(offset).arg(offset + size - 1);
    QString text = indexList(indices, kShownIndices);
    if (indices.size() > kShownIndices) text += QStringLiteral(", …");
    return indices.size() == 1 ? text : MicroBatchTableModel::tr("%1 (%2 samples)").arg(text).arg(indices.size());
}

MicroBatchTableModel::MicroBatchTableModel(QObject* parent) : QAbstractTableModel(parent) {}

void MicroBatchTableModel::clear() {
    beginResetModel();
    m_rows.clear();
    m_pending.reset();
    m_largestNorm = 0;
    endResetModel();
}

void MicroBatchTableModel::addMicroBatch(const core::MicroBatchDone& done) {
    // The micro-batch that was pending is now committed: it takes the pending row's place.
    if (m_pending) {
        const int row = static_cast<int>(m_rows.size());
        beginRemoveRows({}, row, row);
        m_pending.reset();
        endRemoveRows();
    }
    const int row = static_cast<int>(m_rows.size());
    beginInsertRows({}, row, row);
    m_rows.push_back(done);
    endInsertRows();
    if (done.gradientNorm > m_largestNorm) {
        m_largestNorm = done.gradientNorm;
        // Every bar is relative to the largest norm so far.
        Q_EMIT dataChanged(index(0, NormColumn), index(row, NormColumn), {NormFractionRole});
    }
}

void MicroBatchTableModel::reset(std::vector<core::MicroBatchDone> rows,
                                 const std::optional<core::StepModeWaiting>& pending, bool pendingSameBatch) {
    beginResetModel();
    m_rows = std::move(rows);
    m_pending = pending;
    m_pendingSameBatch = pendingSameBatch;
    m_largestNorm = 0;
    for (const core::MicroBatchDone& row : m_rows) m_largestNorm = std::max(m_largestNorm, row.gradientNorm);
    endResetModel();
}

void MicroBatchTableModel::setPending(const std::optional<core::StepModeWaiting>& waiting, bool sameBatch) {
    const int row = static_cast<int>(m_rows.size());
    if (m_pending && !waiting) {
        beginRemoveRows({}, row, row);
        m_pending.reset();
        endRemoveRows();
        return;
    }
    if (!waiting) return;
    if (!m_pending) {
        beginInsertRows({}, row, row);
        m_pending = waiting;
        m_pendingSameBatch = sameBatch;
        endInsertRows();
        return;
    }
    m_pending = waiting;
    m_pendingSameBatch = sameBatch;
    Q_EMIT dataChanged(index(row, 0), index(row, ColumnCount - 1));
}

int MicroBatchTableModel::rowCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : static_cast<int>(m_rows.size()) + (m_pending ? 1 : 0);
}

int MicroBatchTableModel::columnCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant MicroBatchTableModel::data(const QModelIndex& index, int role) const {
    if (!index.isValid()) return {};
    const auto row = static_cast<std::size_t>(index.row());
    if (row < m_rows.size()) return committedData(m_rows[row], index.column(), role);
    return pendingData(index.column(), role);
}

QVariant MicroBatchTableModel::committedData(const core::MicroBatchDone& r, int column, int role) const {
    if (role == PendingRole) return false;
    if (role == NormFractionRole) return m_largestNorm > 0 ? r.gradientNorm / m_largestNorm : 0.0;
    if (role == Qt::TextAlignmentRole)
        return column == SamplesColumn ? QVariant(Qt::AlignLeft | Qt::AlignVCenter)
                                       : QVariant(Qt::AlignRight | Qt::AlignVCenter);
    if (role == Qt::DisplayRole) {
        switch (column) {
        case IndexColumn: return r.probeTrial ? tr("%1 (probe)").arg(r.index + 1) : QString::number(r.index + 1);
        case SizeColumn: return QString::number(r.size);
        case WeightColumn: return lossWeightText(r.size, r.targetBatch);
        case SamplesColumn: return sampleSummary(r.sampleIndices, r.offset, r.size);
        case NormColumn: return r.gradientNorm > 0 ? QString::number(r.gradientNorm, 'g', 4) : QStringLiteral("—");
        default: return {};
        }
    }
    if (role == Qt::ToolTipRole) {
        switch (column) {
        case IndexColumn:
            return r.probeTrial ? tr("Micro-batch %1 of step %2 was a probe trial that fit: its "
                                     "gradients count toward this batch, nothing was wasted.")
                                      .arg(r.index + 1)
                                      .arg(r.step)
                                : tr("Micro-batch %1 of step %2; its own mean loss was %3.")
                                      .arg(r.index + 1)
                                      .arg(r.step)
                                      .arg(r.loss, 0, 'g', 4);
        case SizeColumn: return tr("%1 samples went through the model together in this micro-batch.").arg(r.size);
        case WeightColumn:
            return tr("This micro-batch holds %1 of the batch's %2 samples, so its mean loss is "
                      "multiplied by %1/%2 before backward. The weights of all micro-batches add up "
                      "to 1: the sum is the mean loss of the whole batch.")
                .arg(r.size)
                .arg(r.targetBatch);
        case SamplesColumn:
            return r.sampleIndices.empty() ? tr("Samples %1 to %2 of the training batch (turn on Step by step to see "
                                                "their dataset indices).")
                                                 .arg(r.offset)
                                                 .arg(r.offset + r.size - 1)
                                           : indexTooltip(r.sampleIndices);
        case NormColumn:
            return tr(
                "Length (L2 norm) of the batch's summed gradient after this micro-batch was "
                "added. It changes as micro-batches accumulate and ends at the gradient the "
                "optimizer steps with.");
        default: return {};
        }
    }
    return {};
}

QVariant MicroBatchTableModel::pendingData(int column, int role) const {
    if (!m_pending) return {};
    const core::StepModeWaiting& w = *m_pending;
    if (role == PendingRole) return true;
    if (role == Qt::FontRole) {
        QFont font;
        font.setItalic(true);
        return font;
    }
    if (role == Qt::TextAlignmentRole)
        return column == SamplesColumn ? QVariant(Qt::AlignLeft | Qt::AlignVCenter)
                                       : QVariant(Qt::AlignRight | Qt::AlignVCenter);
    if (role == Qt::DisplayRole) {
        switch (column) {
        case IndexColumn: return m_pendingSameBatch ? tr("next") : tr("next (step %1)").arg(w.step);
        case SizeColumn: return QString::number(w.size);
        case WeightColumn: return lossWeightText(w.size, w.targetBatch);
        case SamplesColumn:
            return w.probeTrial
                       ? tr("positions %1–%2 (probe trial: it may not fit)").arg(w.offset).arg(w.offset + w.size - 1)
                       : sampleSummary({}, w.offset, w.size);
        case NormColumn: return QStringLiteral("—");
        default: return {};
        }
    }
    if (role == Qt::ToolTipRole)
        return tr("Next: micro-batch %1 of step %2 with %3 samples. The trainer waits here; press "
                  "Next micro-batch to run it.")
            .arg(w.index + 1)
            .arg(w.step)
            .arg(w.size);
    return {};
}

QVariant MicroBatchTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal) return {};
    if (role == Qt::DisplayRole) {
        switch (section) {
        case IndexColumn: return tr("#");
        case SizeColumn: return tr("Samples");
        case WeightColumn: return tr("Loss weight n_i/T");
        case SamplesColumn: return tr("Which samples");
        case NormColumn: return tr("Gradient norm so far");
        default: return {};
        }
    }
    if (role == Qt::ToolTipRole) {
        switch (section) {
        case IndexColumn: return tr("Position of the micro-batch within the training batch");
        case SizeColumn: return tr("n_i: samples in the micro-batch");
        case WeightColumn:
            return tr(
                "Each micro-batch's mean loss is multiplied by its share n_i/T of the target "
                "batch T, so the summed gradients equal one pass over the whole batch.");
        case SamplesColumn: return tr("Dataset indices of the samples (hover a cell for all of them)");
        case NormColumn:
            return tr(
                "L2 norm of the gradient summed so far in this batch: watch it build up to "
                "the gradient of the whole batch.");
        default: return {};
        }
    }
    return {};
}

MicroBatchTable::MicroBatchTable(QWidget* parent) : QTableView(parent), m_model(new MicroBatchTableModel(this)) {
    setObjectName(QStringLiteral("microBatchTable"));
    setModel(m_model);
    setItemDelegate(new MicroBatchDelegate(this));
    setSelectionMode(QAbstractItemView::NoSelection);
    setFocusPolicy(Qt::NoFocus);
    setAlternatingRowColors(true);
    setWordWrap(false);
    verticalHeader()->hide();
    verticalHeader()->setDefaultSectionSize(fontMetrics().height() + 6);
    QHeaderView* header = horizontalHeader();
    header->setHighlightSections(false);
    // Fixed widths: resizing to contents on every row would be slow at thousands of micro-batches.
    const QFontMetrics fm = fontMetrics();
    header->setSectionResizeMode(QHeaderView::Interactive);
    header->resizeSection(MicroBatchTableModel::IndexColumn,
                          fm.horizontalAdvance(QStringLiteral("next (step 000)")) + 12);
    header->resizeSection(MicroBatchTableModel::SizeColumn, fm.horizontalAdvance(QStringLiteral("Samples")) + 16);
    header->resizeSection(MicroBatchTableModel::WeightColumn,
                          fm.horizontalAdvance(QStringLiteral("Loss weight n_i/T")) + 56);
    header->resizeSection(MicroBatchTableModel::NormColumn,
                          fm.horizontalAdvance(QStringLiteral("Gradient norm so far")) + 60);
    header->setSectionResizeMode(MicroBatchTableModel::SamplesColumn, QHeaderView::Stretch);
    header->setStretchLastSection(false);
    setToolTip(
        tr("The micro-batches of the current training batch: how many samples each held, "
           "the weight n_i/T its loss got, which samples they were, and how the summed "
           "gradient grew. In step-by-step mode the dashed row is the micro-batch that "
           "runs next."));

    // Keep the newest row in view, once per pass of the event loop (not once per row).
    connect(m_model, &QAbstractItemModel::rowsInserted, this, [this] {
        if (m_scrollPending) return;
        m_scrollPending = true;
        QTimer::singleShot(0, this, [this] {
            m_scrollPending = false;
            scrollToBottom();
        });
    });
}

QSize MicroBatchTable::sizeHint() const {
    return {600, verticalHeader()->defaultSectionSize() * 4 + horizontalHeader()->sizeHint().height() + 4};
}

}  // namespace batchpilot::ui
