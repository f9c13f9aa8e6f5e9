#pragma once

#include <deque>

#include <QAbstractTableModel>
#include <QWidget>

#include "core/events/events.h"
#include "ui/session/event_text.h"

class QComboBox;
class QLineEdit;
class QSortFilterProxyModel;
class QTableView;

namespace batchpilot::ui {

/// The rows of the event log (time, kind, details), bounded: the oldest rows go first.
class EventLogModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { TimeColumn, KindColumn, DetailsColumn, ColumnCount };
    explicit EventLogModel(QObject* parent = nullptr);

    /// Adds the logged events among `events` in one model update.
    void addEvents(const QList<core::Event>& events);
    void addRow(const EventRow& row);
    void clear();
    const EventRow& row(int index) const { return m_rows[static_cast<std::size_t>(index)]; }

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

    static constexpr int kMaxRows = 50000;

private:
    void trim();
    std::deque<EventRow> m_rows;
};

/// The event log: a filterable, copyable table of probe trials, OOMs, device switches,
/// target-batch changes, checkpoints, warnings and errors.
class EventLog : public QWidget {
    Q_OBJECT
public:
    explicit EventLog(QWidget* parent = nullptr);

    void addEvents(const QList<core::Event>& events);
    /// A line from the window itself (e.g. a command the user gave, an input problem).
    void addNote(const QString& kind, const QString& details, bool problem = false);
    void clear();

    EventLogModel* model() const { return m_model; }
    /// Rows visible through the current filter.
    int visibleRowCount() const;
    /// Sets the text filter (matches kind and details, case-insensitive).
    void setFilterText(const QString& text);
    /// Restricts the log to one kind (empty: all kinds).
    void setKindFilter(const QString& kind);
    /// Selected rows (or all visible rows when none are selected) as tab-separated text, which
    /// is also what Ctrl+C puts on the clipboard.
    QString selectedText() const;
    void copySelection() const;

private:
    EventLogModel* m_model;
    QSortFilterProxyModel* m_proxy;
    QTableView* m_view;
    QLineEdit* m_filter;
    QComboBox* m_kind;
    double m_lastTime = 0;
};

}  // namespace batchpilot::ui
