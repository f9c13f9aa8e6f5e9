#pragma once

#include <QHash>
#include <QObject>
#include <QString>

#include "core/config/options.h"

class QAbstractButton;
class QAction;

namespace batchpilot::ui {

class RemoteRun;
class RunModel;
class TrainerController;

/// Every command the user gives a run, in one place: the Run menu's actions, which the run panel's
/// buttons also press (bindButton), and the commands that come from fields (target batch, device).
/// Each goes to the controller, is noted for the event log (note()), and the actions are enabled
/// from the RunModel alone: Start when no run is going and the run panel's values are valid,
/// Pause/Resume and Stop during a run, Re-probe unless paused, Next micro-batch and Finish batch
/// while the trainer waits in step mode (one trigger, one micro-batch: the action is disabled until
/// it waits again), Check equivalence during a run.
class RunCommands : public QObject {
    Q_OBJECT
public:
    RunCommands(TrainerController* controller, RunModel* model, QObject* parent = nullptr);

    const RunModel& model() const { return *m_model; }

    QAction* startAction() const { return m_start; }
    QAction* pauseAction() const { return m_pause; }  ///< Pause, or Resume while paused
    QAction* stopAction() const { return m_stop; }
    QAction* reprobeAction() const { return m_reprobe; }
    QAction* stepModeAction() const { return m_stepMode; }  ///< checkable
    QAction* nextAction() const { return m_next; }
    QAction* finishAction() const { return m_finish; }
    QAction* checkAction() const { return m_check; }

    /// A run served elsewhere (File → Connect to run) that the commands act on instead of this
    /// window's own, when its token can steer it; null: this window's runs.
    void setRemote(RemoteRun* remote);
    /// The commands act on a run now: this window's, or a connected one they can steer.
    bool steering() const;
    /// Steering a served run (batchpilot-cli --serve), not one of this window's.
    bool steeringRemote() const { return m_remote != nullptr && steering(); }
    /// While held, the run panel's fields send no command: the window is filling them with a
    /// run's own values (a served run's configuration), which are no change to ask for.
    void holdFieldCommands(bool held) { m_fieldsHeld = held; }

    /// Why the run panel's values cannot start a run (empty: they can): Start's state and tooltip.
    void setStartProblem(const QString& problem);
    /// Samples of the next equivalence check; 0 means the whole training batch.
    void setEquivalenceSamples(qint64 samples) { m_equivalenceSamples = samples; }

    /// The target batch from the next training batch on (during a run; otherwise nothing).
    void setTargetBatch(qint64 target, core::LrScaling rule);
    /// Moves the run to `device` at the next training batch (nothing when it was asked for last).
    /// With several devices, `rank` names the rank that moves.
    void switchDevice(const QString& device, int rank = 0);

Q_SIGNALS:
    /// Start was triggered (the window starts a run with the run panel's values).
    void startRequested();
    /// Check equivalence was triggered during a run.
    void equivalenceRequested();
    /// A command given, in words, for the event log.
    void note(const QString& details);

private:
    QAction* action(const QString& text, const QKeySequence& shortcut, const QString& name, const QString& tip);
    void update();

    TrainerController* m_controller;
    RunModel* m_model;
    RemoteRun* m_remote = nullptr;
    bool m_fieldsHeld = false;
    QString m_startProblem;
    qint64 m_equivalenceSamples = 0;
    QHash<int, QString> m_requestedDevices;  ///< the device each rank was last asked to use

    QAction* m_start;
    QAction* m_pause;
    QAction* m_stop;
    QAction* m_reprobe;
    QAction* m_stepMode;
    QAction* m_next;
    QAction* m_finish;
    QAction* m_check;
};

/// Makes `button` press `action`: the button shows the action's text (without its mnemonic), its
/// tooltip, whether it is enabled and, for a checkable action, whether it is checked; clicking
/// (or toggling) the button triggers (or checks) the action.
void bindButton(QAbstractButton* button, QAction* action);

}  // namespace batchpilot::ui
