#pragma once

#include <optional>
#include <vector>

#include <QList>
#include <QWidget>

#include "core/events/events.h"
#include "ui/session/run_model.h"

class QLabel;
class QVariantAnimation;

namespace batchpilot::ui {

class MicroBatchTable;

/// The training batch being built: a bar as wide as the target batch, split into its
/// micro-batches, filling as each micro-batch's backward pass completes. An out-of-memory error
/// is marked where it hit; the work it threw away stays as a red hatched ghost while the batch is
/// replayed with the smaller micro-batch. The bar flashes when the optimizer steps. A caption
/// states the plan, e.g. "1024 = 16 × 64 (micro-batch 64, 16 accumulation steps)".
///
/// Under the bar, a table lists the batch's committed micro-batches: size, loss weight n_i/T,
/// samples and the running gradient norm. In step-by-step mode the micro-batch the trainer waits
/// to run is drawn dashed ("next"), on the bar and in the table. After the optimizer step a badge
/// "optimizer step N" stays until the next batch starts.
///
/// The plan (caption and tick marks) comes from the RunModel (setPlan); the micro-batches, OOMs
/// and steps from the events.
class AccumulationView : public QWidget {
    Q_OBJECT
public:
    explicit AccumulationView(QWidget* parent = nullptr);

    void handle(const core::Event& event);
    /// The events of one delivery, in order: the same as handle() on each, but a large batch (a
    /// run read from its folder) updates the widgets once, at its end.
    void handleEvents(const QList<core::Event>& events);
    void clear();
    /// The run's plan: micro-batch × accumulation steps = target batch.
    void setPlan(const RunPlan& plan);

    /// The plan caption shown above the bar (empty before the first probe finished).
    QString caption() const;
    qint64 filledSamples() const;
    qint64 targetBatch() const { return m_target; }
    int replays() const { return m_replays; }
    /// "optimizer step N (k micro-batches)" from the optimizer step until the next batch starts;
    /// empty otherwise.
    QString stepBadge() const;
    /// The micro-batch the trainer waits to run (step-by-step mode).
    std::optional<core::StepModeWaiting> pending() const { return m_pending; }
    /// Gradient norm after the latest committed micro-batch (0 when not reported).
    double gradientNorm() const { return m_gradientNorm; }
    MicroBatchTable* table() const { return m_table; }
    /// Several devices: every rank's part of the batch (from the last RanksStepped, with the next
    /// shares when they changed); empty on one device. This window's micro-batches fill rank 0's.
    const std::vector<core::RankStep>& ranks() const { return m_ranks; }

private:
    struct Segment {
        qint64 offset = 0;
        qint64 size = 0;
        bool probeTrial = false;
    };
    void startBatch(qint64 step);
    // The micro-batch table's calls: to the model at once, or while a large delivery is handled,
    // to a copy that replaces the model's rows at its end.
    void tableClear();
    void tableAdd(const core::MicroBatchDone& done);
    void tablePending(const std::optional<core::StepModeWaiting>& waiting, bool sameBatch);
    void showBadge();
    void updateCaption();

    QLabel* m_caption;
    QLabel* m_status;
    QLabel* m_badge;
    QWidget* m_bar;
    MicroBatchTable* m_table;
    QVariantAnimation* m_flash;
    qint64 m_target = 0;
    qint64 m_microBatch = 0;
    qint64 m_accumulation = 0;
    qint64 m_step = 0;
    qint64 m_lastCommitted = 0;
    qint64 m_badgeMicroBatches = 0;  ///< of the optimizer step the badge shows
    bool m_batching = false;         ///< handling a large delivery: widgets are updated at its end
    bool m_badgeDue = false;         ///< show the badge at the delivery's end
    bool m_badgeHideDue = false;     ///< hide it there (a new batch began after the last step)
    struct TableCopy {
        std::vector<core::MicroBatchDone> rows;
        std::optional<core::StepModeWaiting> pending;
        bool sameBatch = false;
    } m_tableCopy;
    int m_replays = 0;
    std::vector<Segment> m_segments;
    qint64 m_filled = 0;               ///< the samples m_segments cover, to their furthest end
    std::vector<Segment> m_lost;       // work thrown away by an OOM, replayed
    std::vector<qint64> m_oomOffsets;  // sample positions where an OOM hit
    double m_flashLevel = 0;
    std::optional<core::StepModeWaiting> m_pending;
    double m_gradientNorm = 0;
    std::vector<core::RankStep> m_ranks;

    friend class AccumulationBar;
};

}  // namespace batchpilot::ui
