#pragma once

#include <QObject>

#include "core/events/events.h"

class QAction;
class QMenu;
class QWidget;

namespace batchpilot::ui {

class EquivalenceDialog;
class RunCommands;

/// The teaching entries of the Run menu: RunCommands' Step by step (Ctrl+T), Next micro-batch (N),
/// Finish batch (F) and Check equivalence (Ctrl+G), and Last equivalence check, whose dialog opens
/// when a check the user asked for arrives (and an open one always shows the newest result).
class TeachingTools : public QObject {
    Q_OBJECT
public:
    TeachingTools(RunCommands* commands, QWidget* window);

    void addActions(QMenu* run);
    void handle(const core::Event& event);

    /// The dialog (nullptr until a result was shown).
    EquivalenceDialog* equivalenceDialog() const { return m_dialog; }
    /// Opens the dialog with the run's last result (nothing when there is none).
    void showLastEquivalence();
    QAction* showLastAction() const { return m_showCheck; }

private:
    RunCommands* m_commands;
    QWidget* m_window;
    EquivalenceDialog* m_dialog = nullptr;
    bool m_equivalenceAsked = false;
    QAction* m_showCheck;
};

}  // namespace batchpilot::ui
