#include "ui/teaching/teaching_box.h"

#include <QCheckBox>
#include <QGridLayout>
#include <QLabel>
#include <QPushButton>
#include <QSpinBox>

namespace batchpilot::ui {

TeachingBox::TeachingBox(QWidget* parent) : QGroupBox(tr("Teaching"), parent) {
    m_stepMode = new QCheckBox(tr("Step by step"));
    m_stepMode->setObjectName(QStringLiteral("stepModeBox"));
    m_stepMode->setToolTip(
        tr("Run one micro-batch at a time (Ctrl+T). Training stops before "
           "each micro-batch so you can watch its gradients being added to "
           "the batch; turn it off to let training run on."));
    m_next = new QPushButton(tr("Next micro-batch"));
    m_next->setObjectName(QStringLiteral("nextMicroBatchButton"));
    m_next->setToolTip(
        tr("Run exactly one more micro-batch (N): its forward and backward pass, "
           "its gradients weighted by n_i/T and added to the batch's sum."));
    m_finish = new QPushButton(tr("Finish batch"));
    m_finish->setObjectName(QStringLiteral("finishBatchButton"));
    m_finish->setToolTip(
        tr("Run the rest of this training batch and the optimizer step (F), "
           "then wait again before the next batch."));
    m_stepInfo = new QLabel;
    m_stepInfo->setObjectName(QStringLiteral("stepInfo"));
    m_stepInfo->setWordWrap(true);
    m_stepInfo->setToolTip(
        tr("What the trainer will do when you press Next micro-batch: which "
           "micro-batch of which step, and how many samples it holds."));
    m_checkBatch = new QSpinBox;
    m_checkBatch->setRange(0, 100'000'000);
    m_checkBatch->setGroupSeparatorShown(false);
    m_checkBatch->setToolTip(
        tr("How many samples of the last training batch the check uses. Whole "
           "batch compares the full target batch; choose fewer when the whole "
           "batch cannot fit in one pass on a real GPU."));
    m_checkBatch->setObjectName(QStringLiteral("checkBatch"));
    m_checkBatch->setSpecialValueText(tr("whole batch"));
    m_checkBatch->setSuffix(tr(" samples"));
    m_check = new QPushButton(tr("Check equivalence"));
    m_check->setObjectName(QStringLiteral("checkEquivalenceButton"));
    m_check->setToolTip(
        tr("Prove that accumulation is exact (Ctrl+G): the gradient of the last "
           "batch summed over its micro-batches is compared with the gradient of "
           "one pass over the whole batch. Runs at the end of the current batch."));

    connect(m_stepMode, &QCheckBox::toggled, this, [this](bool on) {
        update();
        Q_EMIT stepModeChanged(on);
    });
    // One click, one micro-batch: the buttons stay disabled until the trainer waits again. A
    // disabled button loses the keyboard focus (to the Check batch box, which would swallow the
    // N and F shortcuts as typing), so Next gets it back when the trainer waits again.
    connect(m_next, &QPushButton::clicked, this, [this] {
        m_refocusNext = true;
        setStepWaiting(false);
        Q_EMIT nextMicroBatchRequested();
    });
    connect(m_finish, &QPushButton::clicked, this, [this] {
        m_refocusNext = true;
        setStepWaiting(false);
        Q_EMIT finishBatchRequested();
    });
    connect(m_check, &QPushButton::clicked, this, [this] { Q_EMIT equivalenceRequested(m_checkBatch->value()); });

    setToolTip(
        tr("Slow training down to one micro-batch at a time, and check that "
           "accumulating micro-batches gives the same gradient as one big batch."));
    auto* grid = new QGridLayout(this);
    grid->setContentsMargins(6, 4, 6, 4);
    grid->setVerticalSpacing(3);
    grid->addWidget(m_stepMode, 0, 0, 1, 2);
    grid->addWidget(m_next, 1, 0);
    grid->addWidget(m_finish, 1, 1);
    grid->addWidget(m_stepInfo, 2, 0, 1, 2);
    auto* checkLabel = new QLabel(tr("Check batch"));
    checkLabel->setBuddy(m_checkBatch);
    grid->addWidget(checkLabel, 3, 0);
    grid->addWidget(m_checkBatch, 3, 1);
    grid->addWidget(m_check, 4, 0, 1, 2);
    update();
}

void TeachingBox::setRunState(bool running, bool /*paused*/) {
    // Start was just pressed: in step mode, Next takes the focus at the first wait.
    if (running && !m_running) m_refocusNext = m_stepMode->isChecked();
    m_running = running;
    update();
}

void TeachingBox::update() {
    const bool stepping = m_running && m_stepMode->isChecked();
    m_next->setEnabled(stepping && m_stepWaiting);
    m_finish->setEnabled(stepping && m_stepWaiting);
    m_check->setEnabled(m_running);
    if (!m_stepMode->isChecked())
        m_stepInfo->setText(tr("Off: training runs on by itself."));
    else if (!m_running)
        m_stepInfo->setText(tr("The next run waits before its first micro-batch."));
    else if (!m_stepWaiting)
        m_stepInfo->setText(tr("Running…"));
    else
        m_stepInfo->setText(tr("Waiting to run %1.").arg(m_stepNext));
}

bool TeachingBox::stepMode() const {
    return m_stepMode->isChecked();
}

void TeachingBox::setStepMode(bool on) {
    m_stepMode->setChecked(on);
}

void TeachingBox::setStepWaiting(bool waiting, const QString& next) {
    m_stepWaiting = waiting;
    m_stepNext = next;
    update();
    if (waiting && m_refocusNext && m_next->isEnabled()) {
        m_refocusNext = false;
        m_next->setFocus();
    }
}

}  // namespace batchpilot::ui
