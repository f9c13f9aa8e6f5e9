#include "ui/log/event_log.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPalette>
#include <QScrollBar>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QVBoxLayout>

namespace batchpilot::ui {

namespace {

/// Filters on the kind column (exact) and on kind + details (substring).
class EventFilter : public QSortFilterProxyModel {
public:
    using QSortFilterProxyModel::QSortFilterProxyModel;

    void setKind(const QString& kind) {
        m_kind = kind;
        invalidateFilter();
    }
    void setText(const QString& text) {
        m_text = text;
        invalidateFilter();
    }

protected:
    bool filterAcceptsRow(int sourceRow, const QModelIndex&) const override {
        const auto* model = static_cast<const EventLogModel*>(sourceModel());
        const EventRow& row = model->row(sourceRow);
        if (!m_kind.isEmpty() && row.kind != m_kind) return false;
        return m_text.isEmpty() || row.kind.contains(m_text, Qt::CaseInsensitive) ||
               row.details.contains(m_text, Qt::CaseInsensitive);
    }

private:
    QString m_kind;
    QString m_text;
};

}  // namespace

EventLogModel::EventLogModel(QObject* parent) : QAbstractTableModel(parent) {}

void EventLogModel::addEvents(const QList<core::Event>& events) {
    std::vector<EventRow> rows;
    for (const core::Event& event : events)
        if (isLogged(event)) rows.push_back(describeEvent(event));
    if (rows.empty()) return;
    const int first = static_cast<int>(m_rows.size());
    beginInsertRows({}, first, first + static_cast<int>(rows.size()) - 1);
    for (EventRow& row : rows) m_rows.push_back(std::move(row));
    endInsertRows();
    trim();
}

void EventLogModel::addRow(const EventRow& row) {
    const int first = static_cast<int>(m_rows.size());
    beginInsertRows({}, first, first);
    m_rows.push_back(row);
    endInsertRows();
    trim();
}

void EventLogModel::trim() {
    if (m_rows.size() <= static_cast<std::size_t>(kMaxRows)) return;
    // Drop a tenth at once so trimming is rare.
    const int drop = static_cast<int>(m_rows.size()) - kMaxRows + kMaxRows / 10;
    beginRemoveRows({}, 0, drop - 1);
    m_rows.erase(m_rows.begin(), m_rows.begin() + drop);
    endRemoveRows();
}

void EventLogModel::clear() {
    beginResetModel();
    m_rows.clear();
    endResetModel();
}

int EventLogModel::rowCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : static_cast<int>(m_rows.size());
}

int EventLogModel::columnCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant EventLogModel::data(const QModelIndex& index, int role) const {
    if (!index.isValid()) return {};
    const EventRow& row = m_rows[static_cast<std::size_t>(index.row())];
    if (role == Qt::DisplayRole || role == Qt::ToolTipRole) {
        switch (index.column()) {
        case TimeColumn: return QString::number(row.time, 'f', 2);
        case KindColumn: return row.kind;
        case DetailsColumn: return row.details;
        default: return {};
        }
    }
    if (role == Qt::ForegroundRole && row.problem) {
        // Readable red on light and dark backgrounds.
        const bool dark = QApplication::palette().color(QPalette::Base).lightness() < 128;
        return dark ? QColor(0xff, 0x7b, 0x7b) : QColor(0xb0, 0x10, 0x10);
    }
    if (role == Qt::TextAlignmentRole && index.column() == TimeColumn)
        return QVariant::fromValue(Qt::AlignRight | Qt::AlignVCenter);
    return {};
}

QVariant EventLogModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
    case TimeColumn: return tr("Time (s)");
    case KindColumn: return tr("Kind");
    case DetailsColumn: return tr("Details");
    default: return {};
    }
}

EventLog::EventLog(QWidget* parent)
    : QWidget(parent),
      m_model(new EventLogModel(this)),
      m_proxy(new EventFilter(this)),
      m_view(new QTableView),
      m_filter(new QLineEdit),
      m_kind(new QComboBox) {
    m_proxy->setSourceModel(m_model);
    m_view->setModel(m_proxy);
    m_view->setObjectName(QStringLiteral("eventTable"));
    m_view->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_view->setSelectionMode(QAbstractItemView::ExtendedSelection);
    m_view->setAlternatingRowColors(true);
    m_view->setWordWrap(false);
    m_view->verticalHeader()->setVisible(false);
    m_view->verticalHeader()->setDefaultSectionSize(m_view->fontMetrics().height() + 6);
    m_view->horizontalHeader()->setStretchLastSection(true);
    m_view->horizontalHeader()->setSectionResizeMode(EventLogModel::TimeColumn, QHeaderView::ResizeToContents);
    m_view->setColumnWidth(EventLogModel::KindColumn, 110);
    m_view->setContextMenuPolicy(Qt::ActionsContextMenu);
    m_view->setToolTip(
        tr("Everything that happened in the run, in order: probe trials, "
           "out-of-memory errors and how they were recovered, steps you took by "
           "hand, equivalence checks and your own commands. Red rows are problems. "
           "Select rows and press Ctrl+C to copy them."));

    auto* copy = new QAction(tr("Copy"), m_view);
    copy->setShortcut(QKeySequence::Copy);
    copy->setShortcutContext(Qt::WidgetWithChildrenShortcut);
    connect(copy, &QAction::triggered, this, &EventLog::copySelection);
    m_view->addAction(copy);
    auto* copyAll = new QAction(tr("Copy all visible rows"), m_view);
    connect(copyAll, &QAction::triggered, this, [this] {
        m_view->clearSelection();
        copySelection();
    });
    m_view->addAction(copyAll);

    m_filter->setPlaceholderText(tr("Filter…"));
    m_filter->setClearButtonEnabled(true);
    m_filter->setObjectName(QStringLiteral("eventFilter"));
    m_filter->setToolTip(
        tr("Show only rows whose kind or details contain this text, e.g. a "
           "micro-batch size or \"OOM\"."));
    connect(m_filter, &QLineEdit::textChanged, this, &EventLog::setFilterText);

    m_kind->addItem(tr("All kinds"), QString());
    for (const QString& kind :
         {tr("state"), tr("probe started"), tr("probe trial"), tr("probe finished"), tr("OOM"), tr("target batch"),
          tr("device switch"), tr("checkpoint"), tr("warning"), tr("error"), tr("command"), tr("step by step"),
          tr("equivalence"), tr("memory savers"), tr("loss scale")})
        m_kind->addItem(kind, kind);
    m_kind->setToolTip(
        tr("Show one kind of event only, e.g. the probe's trials or the "
           "out-of-memory errors."));
    connect(m_kind, &QComboBox::currentIndexChanged, this,
            [this] { static_cast<EventFilter*>(m_proxy)->setKind(m_kind->currentData().toString()); });

    auto* top = new QHBoxLayout;
    top->setContentsMargins(0, 0, 0, 0);
    top->addWidget(new QLabel(tr("Events")));
    top->addWidget(m_kind);
    top->addWidget(m_filter, 1);

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    layout->setSpacing(4);
    layout->addLayout(top);
    layout->addWidget(m_view, 1);
}

void EventLog::addEvents(const QList<core::Event>& events) {
    for (const core::Event& event : events)
        std::visit([this](const auto& e) { m_lastTime = std::max(m_lastTime, e.time); }, event);
    const bool atBottom = m_view->verticalScrollBar()->value() == m_view->verticalScrollBar()->maximum();
    m_model->addEvents(events);
    if (atBottom) m_view->scrollToBottom();
}

void EventLog::addNote(const QString& kind, const QString& details, bool problem) {
    m_model->addRow(EventRow{m_lastTime, kind, details, problem});
    m_view->scrollToBottom();
}

void EventLog::clear() {
    m_model->clear();
    m_lastTime = 0;
}

int EventLog::visibleRowCount() const {
    return m_proxy->rowCount();
}

void EventLog::setFilterText(const QString& text) {
    if (m_filter->text() != text) m_filter->setText(text);
    static_cast<EventFilter*>(m_proxy)->setText(text);
}

void EventLog::setKindFilter(const QString& kind) {
    const int index = m_kind->findData(kind);
    m_kind->setCurrentIndex(index < 0 ? 0 : index);
}

QString EventLog::selectedText() const {
    QList<int> rows;
    const QModelIndexList selected = m_view->selectionModel()->selectedRows();
    for (const QModelIndex& index : selected) rows << index.row();
    std::sort(rows.begin(), rows.end());
    if (rows.isEmpty())
        for (int row = 0; row < m_proxy->rowCount(); ++row) rows << row;
    QStringList lines;
    for (int row : std::as_const(rows)) {
        QStringList cells;
        for (int column = 0; column < EventLogModel::ColumnCount; ++column)
            cells << m_proxy->index(row, column).data().toString();
        lines << cells.join(QLatin1Char('\t'));
    }
    return lines.join(QLatin1Char('\n'));
}

void EventLog::copySelection() const {
    QApplication::clipboard()->setText(selectedText());
}

}  // namespace batchpilot::ui
