#pragma once

#include <QGroupBox>
#include <QString>

class QCheckBox;
class QLabel;
class QPushButton;
class QSpinBox;

namespace batchpilot::ui {

class RunCommands;

/// The run panel's "Teaching" box: Step by step with Next micro-batch and Finish batch, and
/// Check equivalence with its check batch. Its buttons press RunCommands' actions; what the
/// trainer waits to run is read from the RunModel.
class TeachingBox : public QGroupBox {
    Q_OBJECT
public:
    explicit TeachingBox(RunCommands* commands, QWidget* parent = nullptr);

    QCheckBox* stepModeBox() const { return m_stepMode; }
    QPushButton* nextMicroBatchButton() const { return m_next; }
    QPushButton* finishBatchButton() const { return m_finish; }
    QPushButton* checkEquivalenceButton() const { return m_check; }
    /// Samples of the equivalence check; 0 means the whole training batch.
    QSpinBox* checkBatchBox() const { return m_checkBatch; }
    /// What the box says the trainer does next ("Waiting to run micro-batch 3 of step 2 …").
    QString stepText() const;

private:
    void update();

    RunCommands* m_commands;
    QCheckBox* m_stepMode;
    QPushButton* m_next;
    QPushButton* m_finish;
    QLabel* m_stepInfo;
    QPushButton* m_check;
    QSpinBox* m_checkBatch;

    bool m_wasRunning = false;
    bool m_refocusNext = false;  // give Next the focus when the trainer waits again
};

}  // namespace batchpilot::ui
