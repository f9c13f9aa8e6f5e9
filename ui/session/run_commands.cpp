#include "ui/session/run_commands.h"

#include <QAbstractButton>
#include <QAction>
#include <QKeySequence>
#include <QSignalBlocker>

#include "ui/session/remote_run.h"
#include "ui/session/run_model.h"
#include "ui/session/trainer_controller.h"

namespace batchpilot::ui {

RunCommands::RunCommands(TrainerController* controller, RunModel* model, QObject* parent)
    : QObject(parent), m_controller(controller), m_model(model) {
    m_start = action(tr("&Start"), QKeySequence(Qt::Key_F5), QStringLiteral("startAction"), tr("Start training (F5)"));
    m_pause = action(tr("&Pause"), QKeySequence(Qt::Key_F6), QStringLiteral("pauseAction"),
                     tr("Pause training after the current micro-batch (F6); nothing is lost, Resume goes on with "
                        "the same batch."));
    m_stop = action(tr("S&top"), QKeySequence(Qt::SHIFT | Qt::Key_F5), QStringLiteral("stopAction"),
                    tr("End the run after the current micro-batch (Shift+F5). The unfinished batch is dropped, so "
                       "the model keeps its last complete optimizer step."));
    m_reprobe = action(tr("&Re-probe"), QKeySequence(tr("Ctrl+R")), QStringLiteral("reprobeAction"),
                       tr("Search the largest micro-batch again on the current device, without stopping (at the "
                          "next training batch). Useful when memory was freed or taken by something else."));
    m_stepMode = action(tr("Step &by step"), QKeySequence(tr("Ctrl+T")), QStringLiteral("stepModeAction"),
                        tr("Run one micro-batch at a time (Ctrl+T). Training stops before each micro-batch so you can "
                           "watch its gradients being added to the batch; turn it off to let training run on."));
    m_stepMode->setCheckable(true);
    m_stepMode->setChecked(m_controller->stepMode());
    m_next = action(tr("&Next micro-batch"), QKeySequence(Qt::Key_N), QStringLiteral("nextAction"),
                    tr("Run exactly one more micro-batch (N): its forward and backward pass, its gradients weighted "
                       "by n_i/T and added to the batch's sum."));
    m_finish = action(tr("&Finish batch"), QKeySequence(Qt::Key_F), QStringLiteral("finishAction"),
                      tr("Run the rest of this training batch and the optimizer step (F), then wait again before the "
                         "next batch."));
    m_check = action(tr("Check &equivalence"), QKeySequence(tr("Ctrl+G")), QStringLiteral("checkAction"),
                     tr("Prove that accumulation is exact (Ctrl+G): the gradient of the last batch summed over its "
                        "micro-batches is compared with the gradient of one pass over the whole batch. Runs at the "
                        "end of the current batch."));

    connect(m_start, &QAction::triggered, this, [this] {
        if (!m_model->isRunning()) Q_EMIT startRequested();
    });
    connect(m_pause, &QAction::triggered, this, [this] {
        if (!steering()) return;
        const bool paused = m_remote ? m_model->state() == core::RunState::Paused : m_model->isPaused();
        if (paused) {
            m_remote ? m_remote->resume() : m_controller->resume();
            Q_EMIT note(tr("resume"));
        } else {
            m_remote ? m_remote->pause() : m_controller->pause();
            Q_EMIT note(tr("pause (within one micro-batch)"));
        }
    });
    connect(m_stop, &QAction::triggered, this, [this] {
        if (!steering()) return;
        m_remote ? m_remote->stop() : m_controller->stop();
        Q_EMIT note(tr("stop (within one micro-batch)"));
    });
    connect(m_reprobe, &QAction::triggered, this, [this] {
        if (!steering()) return;
        m_remote ? m_remote->reprobe() : m_controller->reprobe();
        Q_EMIT note(tr("re-probe on the current device (at the next training batch)"));
    });
    connect(m_stepMode, &QAction::toggled, this, [this](bool on) {
        if (on == m_controller->stepMode()) return;
        m_controller->setStepMode(on);
        if (m_model->isRunning())
            Q_EMIT note(on ? tr("step by step: on (waits before the next micro-batch)")
                           : tr("step by step: off (training runs on)"));
    });
    connect(m_next, &QAction::triggered, this, [this] {
        if (!m_model->isWaiting()) return;  // a held key: one micro-batch per wait
        m_controller->advance();
        m_model->releaseWait();
    });
    connect(m_finish, &QAction::triggered, this, [this] {
        if (!m_model->isWaiting()) return;
        m_controller->finishBatch();
        m_model->releaseWait();
        Q_EMIT note(tr("finish batch (the rest of it and the optimizer step)"));
    });
    connect(m_check, &QAction::triggered, this, [this] {
        if (!steering()) return;
        if (m_remote)
            m_remote->checkEquivalence(m_equivalenceSamples);
        else
            m_controller->checkEquivalence(m_equivalenceSamples);
        Q_EMIT equivalenceRequested();
        Q_EMIT note(
            m_equivalenceSamples > 0
                ? tr("check equivalence on %1 samples (at the end of the current batch)").arg(m_equivalenceSamples)
                : tr("check equivalence on the whole batch (at the end of the current batch)"));
    });

    connect(m_controller, &TrainerController::runStarted, this, [this](const core::TrainerOptions& options) {
        m_requestedDevices = {{0, QString::fromStdString(options.device)}};
    });
    connect(m_model, &RunModel::changed, this, &RunCommands::update);
    update();
}

QAction* RunCommands::action(const QString& text, const QKeySequence& shortcut, const QString& name,
                             const QString& tip) {
    auto* made = new QAction(text, this);
    made->setShortcut(shortcut);
    made->setObjectName(name);
    made->setToolTip(tip);
    made->setStatusTip(tip);
    return made;
}

void RunCommands::setStartProblem(const QString& problem) {
    m_startProblem = problem;
    update();
}

void RunCommands::setRemote(RemoteRun* remote) {
    if (m_remote) m_remote->disconnect(this);
    m_remote = remote;
    if (m_remote) connect(m_remote, &RemoteRun::stateChanged, this, &RunCommands::update);
    update();
}

bool RunCommands::steering() const {
    if (m_remote) return m_remote->isOpen() && m_remote->canControl() && !m_remote->runEnded();
    return m_model->isRunning();
}

void RunCommands::setTargetBatch(qint64 target, core::LrScaling rule) {
    // The run panel showing a run's own values (a served run's configuration) is no command.
    if (!steering() || m_fieldsHeld || target == m_model->targetBatch()) return;
    if (m_remote)
        m_remote->setTargetBatch(target, rule);
    else
        m_controller->setTargetBatch(target, rule);
    Q_EMIT note(tr("target batch → %1 (at the next training batch)").arg(target));
}

void RunCommands::switchDevice(const QString& device, int rank) {
    if (!steering() || m_fieldsHeld || device == m_requestedDevices.value(rank)) return;
    if (m_remote && rank == 0 && device == m_model->device()) return;  // where it already runs
    m_requestedDevices[rank] = device;
    if (m_remote)
        m_remote->switchDevice(device, rank);
    else
        m_controller->switchDevice(device, rank);
    Q_EMIT note(
        rank == 0 && m_requestedDevices.size() == 1
            ? tr("switch device → %1 (at the next training batch)").arg(device)
            : tr("switch rank %1's device → %2 (every rank agrees at the next training batch)").arg(rank).arg(device));
}

void RunCommands::update() {
    const RunModel& run = *m_model;
    const bool running = run.isRunning();
    // A connected run is steered from here when its token allows it; a run read from its folder
    // never is.
    const bool steers = steering();
    const bool paused = m_remote ? run.state() == core::RunState::Paused : run.isPaused();
    m_start->setEnabled(!running && m_startProblem.isEmpty());
    m_start->setToolTip(!m_startProblem.isEmpty() ? tr("Cannot start: %1").arg(m_startProblem)
                        : run.isWatching()        ? tr("Start training here with the run panel's values (F5); the run "
                                                              "shown is closed (it goes on where it runs)")
                                                  : tr("Start training (F5)"));
    m_pause->setEnabled(steers);
    m_pause->setText(paused ? tr("&Resume") : tr("&Pause"));
    m_stop->setEnabled(steers);
    m_reprobe->setEnabled(steers && !paused);
    m_stepMode->setChecked(run.stepMode());  // toggled() gives the controller what it has: nothing
    m_next->setEnabled(run.isWaiting());
    m_finish->setEnabled(run.isWaiting());
    m_check->setEnabled(steers);
    // A run shown from elsewhere that cannot be steered from here: say why its controls are off.
    QString why;
    if (run.isWatching() && !steers) {
        why = m_remote ? tr("Off: this window watches the run at %1 with a watch-only token (or the run has ended); "
                            "the control token steers it.")
                             .arg(run.watchedFolder())
                       : tr("Off: this window shows the run in %1, read from its events — it trains in another "
                            "process, which this window cannot steer.")
                             .arg(run.watchedFolder());
    }
    for (QAction* action : {m_pause, m_stop, m_reprobe, m_check}) {
        if (!action->property("tip").isValid()) action->setProperty("tip", action->toolTip());
        action->setToolTip(why.isEmpty() ? action->property("tip").toString() : why);
    }
}

void bindButton(QAbstractButton* button, QAction* action) {
    const auto show = [button, action] {
        button->setText(action->iconText());
        button->setToolTip(action->toolTip());
        button->setEnabled(action->isEnabled());
        if (action->isCheckable() && button->isChecked() != action->isChecked()) {
            const QSignalBlocker blocker(button);
            button->setChecked(action->isChecked());
        }
    };
    button->setCheckable(action->isCheckable());
    show();
    QObject::connect(action, &QAction::changed, button, show);
    if (action->isCheckable())
        QObject::connect(button, &QAbstractButton::toggled, action, &QAction::setChecked);
    else
        QObject::connect(button, &QAbstractButton::clicked, action, &QAction::trigger);
}

}  // namespace batchpilot::ui
