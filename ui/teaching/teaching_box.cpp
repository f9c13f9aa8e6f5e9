#include "ui/teaching/teaching_box.h"

#include <QAction>
#include <QCheckBox>
#include <QGridLayout>
#include <QLabel>
#include <QPushButton>
#include <QSpinBox>

#include "ui/session/run_commands.h"
#include "ui/session/run_model.h"

namespace batchpilot::ui {

TeachingBox::TeachingBox(RunCommands* commands, QWidget* parent)
    : QGroupBox(tr("Teaching"), parent), m_commands(commands) {
    m_stepMode = new QCheckBox;
    m_stepMode->setObjectName(QStringLiteral("stepModeBox"));
    bindButton(m_stepMode, commands->stepModeAction());
    m_next = new QPushButton;
    m_next->setObjectName(QStringLiteral("nextMicroBatchButton"));
    bindButton(m_next, commands->nextAction());
    m_finish = new QPushButton;
    m_finish->setObjectName(QStringLiteral("finishBatchButton"));
    bindButton(m_finish, commands->finishAction());
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
    connect(m_checkBatch, &QSpinBox::valueChanged, this,
            [commands](int samples) { commands->setEquivalenceSamples(samples); });
    m_check = new QPushButton;
    m_check->setObjectName(QStringLiteral("checkEquivalenceButton"));
    bindButton(m_check, commands->checkAction());

    // One press, one micro-batch: the buttons stay disabled until the trainer waits again. A
    // disabled button loses the keyboard focus (to the Check batch box, which would swallow the
    // N and F shortcuts as typing), so Next gets it back when the trainer waits again.
    for (QAction* stepping : {commands->nextAction(), commands->finishAction()})
        connect(stepping, &QAction::triggered, this, [this] { m_refocusNext = true; });
    connect(&commands->model(), &RunModel::changed, this, &TeachingBox::update);

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

QString TeachingBox::stepText() const {
    const RunModel& run = m_commands->model();
    if (!run.stepMode()) return tr("Off: training runs on by itself.");
    if (!run.isRunning()) return tr("The next run waits before its first micro-batch.");
    if (!run.isWaiting()) return tr("Running…");
    const core::StepModeWaiting& waiting = *run.waiting();
    QString next =
        tr("micro-batch %1 of step %2 (%3 samples)").arg(waiting.index + 1).arg(waiting.step).arg(waiting.size);
    if (waiting.probeTrial) next += tr(", a probe trial");
    return tr("Waiting to run %1.").arg(next);
}

void TeachingBox::update() {
    const RunModel& run = m_commands->model();
    // Start was just pressed: in step mode, Next takes the focus at the first wait.
    if (run.isRunning() && !m_wasRunning) m_refocusNext = run.stepMode();
    m_wasRunning = run.isRunning();
    m_stepInfo->setText(stepText());
    if (run.isWaiting() && m_refocusNext && m_next->isEnabled()) {
        m_refocusNext = false;
        m_next->setFocus();
    }
}

}  // namespace batchpilot::ui
