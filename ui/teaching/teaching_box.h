#pragma once

#include <QGroupBox>
#include <QString>

class QCheckBox;
class QLabel;
class QPushButton;
class QSpinBox;

namespace batchpilot::ui {

/// The run panel's "Teaching" box: Step by step with Next micro-batch and Finish batch, and
/// Check equivalence with its check batch. It only asks (signals); TeachingTools carries the
/// requests to the trainer and reports back with setStepWaiting().
class TeachingBox : public QGroupBox {
    Q_OBJECT
public:
    explicit TeachingBox(QWidget* parent = nullptr);

    /// Enables the buttons for the run's state (from the run panel).
    void setRunState(bool running, bool paused);
    bool stepMode() const;
    void setStepMode(bool on);
    /// The trainer waits before `next` (e.g. "micro-batch 3 of step 2"), or runs on.
    void setStepWaiting(bool waiting, const QString& next = {});
    bool isStepWaiting() const { return m_stepWaiting; }

    QCheckBox* stepModeBox() const { return m_stepMode; }
    QPushButton* nextMicroBatchButton() const { return m_next; }
    QPushButton* finishBatchButton() const { return m_finish; }
    QPushButton* checkEquivalenceButton() const { return m_check; }
    /// Samples of the equivalence check; 0 means the whole training batch.
    QSpinBox* checkBatchBox() const { return m_checkBatch; }

Q_SIGNALS:
    void stepModeChanged(bool on);
    void nextMicroBatchRequested();
    void finishBatchRequested();
    /// Check equivalence was pressed: `samples` of the last batch (0: all of it).
    void equivalenceRequested(qint64 samples);

private:
    void update();

    QCheckBox* m_stepMode;
    QPushButton* m_next;
    QPushButton* m_finish;
    QLabel* m_stepInfo;
    QPushButton* m_check;
    QSpinBox* m_checkBatch;

    bool m_running = false;
    bool m_stepWaiting = false;
    bool m_refocusNext = false;  // give Next the focus when the trainer waits again
    QString m_stepNext;          // what the trainer waits to run, e.g. "micro-batch 3 of step 2"
};

}  // namespace batchpilot::ui
