#pragma once

#include <QList>
#include <QWidget>

#include "core/events/events.h"

class QLabel;
class QTableWidget;

namespace batchpilot::ui {

/// Several devices: one row per rank of the job (device, its share of the training batch as a
/// bar, micro-batch × accumulation steps, samples/s, time it waited for the others, OOMs, peak),
/// and a caption with the all-reduce time, the balance and the latest share change. Fed by
/// RanksStepped (rank 0 learns every rank's numbers from each step's exchange); hidden until a
/// run on several devices reports one.
class RanksView : public QWidget {
    Q_OBJECT
public:
    explicit RanksView(QWidget* parent = nullptr);
    void handle(const core::Event& event);
    /// A delivery of events: each step's share change is kept, the table shows the last step's
    /// ranks (filled once, not once per step: a run of 256 ranks read from its folder).
    void handleEvents(const QList<core::Event>& events);
    void clear();
    QTableWidget* table() const { return m_table; }
    QString captionText() const;

private:
    /// Keeps the step's share change (if any) for the caption.
    void noteShareChange(const core::RanksStepped& step);
    /// The table and the caption as of `step`.
    void showStep(const core::RanksStepped& step);

    QLabel* m_caption;
    QTableWidget* m_table;
    QString m_lastChange;  ///< the latest share change, in words
};

}  // namespace batchpilot::ui
