#include "ui/window/teaching_tools.h"

#include <QAction>
#include <QMenu>
#include <QWidget>

#include "ui/session/run_commands.h"
#include "ui/session/run_model.h"
#include "ui/teaching/equivalence_dialog.h"

namespace batchpilot::ui {

TeachingTools::TeachingTools(RunCommands* commands, QWidget* window)
    : QObject(window), m_commands(commands), m_window(window) {
    m_showCheck = new QAction(tr("&Last equivalence check…"), this);
    m_showCheck->setObjectName(QStringLiteral("showLastCheckAction"));
    connect(m_showCheck, &QAction::triggered, this, &TeachingTools::showLastEquivalence);
    connect(commands, &RunCommands::equivalenceRequested, this, [this] { m_equivalenceAsked = true; });
    connect(&commands->model(), &RunModel::changed, this, [this] {
        const RunModel& run = m_commands->model();
        if (!run.isRunning()) m_equivalenceAsked = false;
        m_showCheck->setEnabled(run.digest().equivalence.has_value());
    });
    m_showCheck->setEnabled(false);
}

void TeachingTools::addActions(QMenu* run) {
    run->addAction(m_commands->stepModeAction());
    run->addAction(m_commands->nextAction());
    run->addAction(m_commands->finishAction());
    run->addAction(m_commands->checkAction());
    run->addAction(m_showCheck);
}

void TeachingTools::handle(const core::Event& event) {
    if (!std::holds_alternative<core::EquivalenceChecked>(event)) return;
    if (m_equivalenceAsked || (m_dialog != nullptr && m_dialog->isVisible())) showLastEquivalence();
    m_equivalenceAsked = false;
}

void TeachingTools::showLastEquivalence() {
    const auto& last = m_commands->model().digest().equivalence;
    if (!last) return;
    if (m_dialog == nullptr) m_dialog = new EquivalenceDialog(m_window);
    m_dialog->setResult(*last);
    m_dialog->show();
    m_dialog->raise();
    m_dialog->activateWindow();
}

}  // namespace batchpilot::ui
