#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <QAbstractTableModel>
#include <QTableView>

#include "core/events/events.h"

namespace batchpilot::ui {

/// "32/1024 = 0.03125": a micro-batch's loss weight n_i / T as a fraction and a decimal ("≈" when
/// the decimal is rounded).
QString lossWeightText(qint64 size, qint64 target);
/// The first few dataset indices and the count ("17, 503, 88, 1201, … (32 samples)"); without
/// indices the micro-batch's positions in the batch ("positions 32–63 of the batch").
QString sampleSummary(const std::vector<int64_t>& indices, qint64 offset, qint64 size);

/// The committed micro-batches of the current training batch, one row each, plus the micro-batch
/// the trainer waits to run in step-by-step mode ("next", the last row).
class MicroBatchTableModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { IndexColumn, SizeColumn, WeightColumn, SamplesColumn, NormColumn, ColumnCount };
    /// Data roles beyond Qt's: the gradient norm as a fraction of the batch's largest (0..1),
    /// and whether the row is the pending one.
    enum Role { NormFractionRole = Qt::UserRole + 1, PendingRole };

    explicit MicroBatchTableModel(QObject* parent = nullptr);

    /// Starts an empty batch.
    void clear();
    void addMicroBatch(const core::MicroBatchDone& done);
    /// Holds exactly `rows` and `pending` (one model reset): what the calls above would leave after
    /// many events at once (a run read from its folder).
    void reset(std::vector<core::MicroBatchDone> rows, const std::optional<core::StepModeWaiting>& pending,
               bool pendingSameBatch);
    const std::vector<core::MicroBatchDone>& rows() const { return m_rows; }
    const std::optional<core::StepModeWaiting>& pending() const { return m_pending; }
    bool pendingSameBatch() const { return m_pendingSameBatch; }
    /// The micro-batch the trainer waits to run; nullopt removes the pending row.
    void setPending(const std::optional<core::StepModeWaiting>& waiting, bool sameBatch);
    bool hasPending() const { return m_pending.has_value(); }
    /// Committed micro-batches (rows without the pending one).
    int committedCount() const { return static_cast<int>(m_rows.size()); }
    const core::MicroBatchDone& committed(int row) const { return m_rows[static_cast<std::size_t>(row)]; }
    /// Largest gradient norm among the committed micro-batches (0 when none was reported).
    double largestNorm() const { return m_largestNorm; }

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

private:
    QVariant committedData(const core::MicroBatchDone& row, int column, int role) const;
    QVariant pendingData(int column, int role) const;

    std::vector<core::MicroBatchDone> m_rows;
    std::optional<core::StepModeWaiting> m_pending;
    bool m_pendingSameBatch = true;
    double m_largestNorm = 0;
};

/// The table of micro-batches under the accumulation bar: size, loss weight, samples, and the
/// running gradient norm drawn as a bar that grows as the batch accumulates. The pending row is
/// drawn dashed.
class MicroBatchTable : public QTableView {
    Q_OBJECT
public:
    explicit MicroBatchTable(QWidget* parent = nullptr);

    MicroBatchTableModel* tableModel() const { return m_model; }
    QSize sizeHint() const override;

private:
    MicroBatchTableModel* m_model;
    bool m_scrollPending = false;
};

}  // namespace batchpilot::ui
