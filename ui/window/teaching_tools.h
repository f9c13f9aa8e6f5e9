#pragma once

#include <optional>

#include <QObject>

#include "core/events.h"
#include "ui/window/help_text.h"

class QAction;
class QMenu;
class QWidget;

namespace batchpilot::ui {

class EquivalenceDialog;
class RunPanel;
class TrainerController;

/// The teaching features, wired between the run panel, the Run menu and the trainer: step by step
/// (Next micro-batch, Finish batch), Check equivalence and its dialog, and the run's facts that
/// Help > How this works explains.
///
/// The trainer waits after a StepModeWaiting until the next MicroBatchDone, OomEvent or
/// OptimizerStepped; Next and Finish are enabled only in between, and one press runs one
/// micro-batch. The equivalence dialog opens when a check the user asked for arrives.
class TeachingTools : public QObject {
    Q_OBJECT
public:
    TeachingTools(TrainerController* controller, RunPanel* panel, QWidget* window);

    /// Adds Step by step (Ctrl+T), Next micro-batch (N), Finish batch (F), Check equivalence
    /// (Ctrl+G) and Last equivalence check to the Run menu.
    void addActions(QMenu* run);
    void handle(const core::Event& event);

    const RunFacts& facts() const { return m_facts; }
    const std::optional<core::EquivalenceChecked>& lastEquivalence() const { return m_facts.equivalence; }
    /// The dialog (nullptr until a result was shown).
    EquivalenceDialog* equivalenceDialog() const { return m_dialog; }
    /// Opens the dialog with the last result (nothing when there is none).
    void showLastEquivalence();

    QAction* stepModeAction() const { return m_stepMode; }
    QAction* nextAction() const { return m_next; }
    QAction* finishAction() const { return m_finish; }
    QAction* checkAction() const { return m_check; }

Q_SIGNALS:
    /// A command the user gave, for the event log.
    void note(const QString& details);

private:
    void updateActions();
    void setWaiting(const std::optional<core::StepModeWaiting>& waiting);

    TrainerController* m_controller;
    RunPanel* m_panel;
    QWidget* m_window;
    EquivalenceDialog* m_dialog = nullptr;
    RunFacts m_facts;
    bool m_equivalenceAsked = false;

    QAction* m_stepMode = nullptr;
    QAction* m_next = nullptr;
    QAction* m_finish = nullptr;
    QAction* m_check = nullptr;
    QAction* m_showCheck = nullptr;
};

}  // namespace batchpilot::ui
