#pragma once

#include <QDialog>

#include "core/events/events.h"

class QLabel;
class QTableWidget;

namespace batchpilot::ui {

/// The result of Check equivalence: the gradient of a batch accumulated over its micro-batches
/// against one full pass. Large numbers (max |difference|, relative difference, cosine) with a
/// verdict, the per-tensor table (sortable), and the engine's explanation in plain words, with the
/// BatchNorm comparison, the out-of-budget note or the error when they apply. Non-modal: training
/// goes on while it is open; a new result replaces the shown one.
class EquivalenceDialog : public QDialog {
    Q_OBJECT
public:
    explicit EquivalenceDialog(QWidget* parent = nullptr);

    void setResult(const core::EquivalenceChecked& result);
    const core::EquivalenceChecked& result() const { return m_result; }

    /// "Equal up to float rounding", "Different: …" or "The check could not run".
    QString verdict() const;
    /// Everything the dialog says in words (verdict, explanation, notes, error), for tests.
    QString text() const;
    QTableWidget* tensorTable() const { return m_table; }

private:
    core::EquivalenceChecked m_result;
    QLabel* m_verdict;
    QLabel* m_summary;
    QLabel* m_maxAbs;
    QLabel* m_relative;
    QLabel* m_cosine;
    QTableWidget* m_table;
    QLabel* m_explanation;
    QLabel* m_batchNorm;
    QLabel* m_budgetNote;
    QLabel* m_error;
};

}  // namespace batchpilot::ui
