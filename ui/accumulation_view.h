#pragma once

#include <vector>

#include <QWidget>

#include "core/events.h"

class QLabel;
class QVariantAnimation;

namespace batchpilot::ui {

/// The training batch being built: a bar as wide as the target batch, split into its
/// micro-batches, filling as each micro-batch's backward pass completes. An out-of-memory error
/// is marked where it hit; the work it threw away stays as a red hatched ghost while the batch is
/// replayed with the smaller micro-batch. The bar flashes when the optimizer steps. A caption
/// states the plan, e.g. "1024 = 16 × 64 (micro-batch 64, 16 accumulation steps)".
class AccumulationView : public QWidget {
    Q_OBJECT
public:
    explicit AccumulationView(QWidget* parent = nullptr);

    void handle(const core::Event& event);
    void clear();

    /// The plan caption shown above the bar (empty before the first probe finished).
    QString caption() const;
    qint64 filledSamples() const;
    qint64 targetBatch() const { return m_target; }
    int replays() const { return m_replays; }

private:
    struct Segment {
        qint64 offset = 0;
        qint64 size = 0;
        bool probeTrial = false;
    };
    void startBatch(qint64 step);
    void updateCaption();

    QLabel* m_caption;
    QLabel* m_status;
    QWidget* m_bar;
    QVariantAnimation* m_flash;
    qint64 m_target = 0;
    qint64 m_microBatch = 0;
    qint64 m_accumulation = 0;
    qint64 m_step = 0;
    qint64 m_lastCommitted = 0;
    int m_replays = 0;
    std::vector<Segment> m_segments;
    std::vector<Segment> m_lost;       // work thrown away by an OOM, replayed
    std::vector<qint64> m_oomOffsets;  // sample positions where an OOM hit
    double m_flashLevel = 0;

    friend class AccumulationBar;
};

}  // namespace batchpilot::ui
