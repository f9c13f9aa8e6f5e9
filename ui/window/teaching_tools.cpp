#include "ui/window/teaching_tools.h"

#include <QAction>
#include <QCheckBox>
#include <QMenu>
#include <QPushButton>
#include <QWidget>

#include "ui/teaching/equivalence_dialog.h"
#include "ui/config/run_panel.h"
#include "ui/session/trainer_controller.h"

namespace batchpilot::ui {

TeachingTools::TeachingTools(TrainerController* controller, RunPanel* panel, QWidget* window)
    : QObject(window), m_controller(controller), m_panel(panel), m_window(window) {
    connect(m_panel, &RunPanel::stepModeChanged, this, [this](bool on) {
        m_controller->setStepMode(on);
        if (m_stepMode) {
            const QSignalBlocker blocker(m_stepMode);
            m_stepMode->setChecked(on);
        }
        if (m_controller->isRunning())
            Q_EMIT note(on ? tr("step by step: on (waits before the next micro-batch)")
                           : tr("step by step: off (training runs on)"));
        updateActions();
    });
    connect(m_panel, &RunPanel::nextMicroBatchRequested, this, [this] {
        m_controller->advance();
        updateActions();
    });
    connect(m_panel, &RunPanel::finishBatchRequested, this, [this] {
        m_controller->finishBatch();
        Q_EMIT note(tr("finish batch (the rest of it and the optimizer step)"));
        updateActions();
    });
    connect(m_panel, &RunPanel::equivalenceRequested, this, [this](qint64 samples) {
        if (!m_controller->isRunning()) return;
        m_controller->checkEquivalence(samples);
        m_equivalenceAsked = true;
        Q_EMIT note(samples > 0 ? tr("check equivalence on %1 samples (at the end of the current batch)").arg(samples)
                                : tr("check equivalence on the whole batch (at the end of the current batch)"));
    });
    connect(m_controller, &TrainerController::runStarted, this, [this] {
        m_facts = RunFacts{};
        m_equivalenceAsked = false;
        setWaiting(std::nullopt);
    });
    connect(m_controller, &TrainerController::runFinished, this, [this] {
        m_equivalenceAsked = false;
        setWaiting(std::nullopt);
    });
}

void TeachingTools::addActions(QMenu* run) {
    m_stepMode = run->addAction(tr("Step &by step"));
    m_stepMode->setCheckable(true);
    m_stepMode->setChecked(m_panel->stepMode());
    m_stepMode->setShortcut(QKeySequence(tr("Ctrl+T")));
    m_stepMode->setToolTip(m_panel->stepModeBox()->toolTip());
    connect(m_stepMode, &QAction::toggled, m_panel, &RunPanel::setStepMode);
    // The actions press the panel's buttons: a disabled button does nothing, and a press disables
    // it until the trainer waits again, so a held key cannot run more than one micro-batch.
    m_next = run->addAction(tr("&Next micro-batch"), m_panel->nextMicroBatchButton(), &QPushButton::click);
    m_next->setShortcut(QKeySequence(Qt::Key_N));
    m_finish = run->addAction(tr("&Finish batch"), m_panel->finishBatchButton(), &QPushButton::click);
    m_finish->setShortcut(QKeySequence(Qt::Key_F));
    m_check = run->addAction(tr("Check &equivalence"), m_panel->checkEquivalenceButton(), &QPushButton::click);
    m_check->setShortcut(QKeySequence(tr("Ctrl+G")));
    m_showCheck = run->addAction(tr("&Last equivalence check…"), this, &TeachingTools::showLastEquivalence);
    updateActions();
}

void TeachingTools::handle(const core::Event& event) {
    m_facts.handle(event);
    if (const auto* waiting = std::get_if<core::StepModeWaiting>(&event)) {
        setWaiting(*waiting);
    } else if (std::holds_alternative<core::MicroBatchDone>(event) || std::holds_alternative<core::OomEvent>(event) ||
               std::holds_alternative<core::OptimizerStepped>(event)) {
        if (m_panel->isStepWaiting()) setWaiting(std::nullopt);
    } else if (std::holds_alternative<core::EquivalenceChecked>(event)) {
        // Opens for a check the user asked for; an open dialog always shows the newest result.
        if (m_equivalenceAsked || (m_dialog != nullptr && m_dialog->isVisible())) showLastEquivalence();
        m_equivalenceAsked = false;
        updateActions();
    }
}

void TeachingTools::setWaiting(const std::optional<core::StepModeWaiting>& waiting) {
    if (!waiting) {
        m_panel->setStepWaiting(false);
    } else {
        QString next =
            tr("micro-batch %1 of step %2 (%3 samples)").arg(waiting->index + 1).arg(waiting->step).arg(waiting->size);
        if (waiting->probeTrial) next += tr(", a probe trial");
        m_panel->setStepWaiting(true, next);
    }
    updateActions();
}

void TeachingTools::showLastEquivalence() {
    if (!m_facts.equivalence) return;
    if (m_dialog == nullptr) m_dialog = new EquivalenceDialog(m_window);
    m_dialog->setResult(*m_facts.equivalence);
    m_dialog->show();
    m_dialog->raise();
    m_dialog->activateWindow();
}

void TeachingTools::updateActions() {
    if (m_next == nullptr) return;
    const bool running = m_controller->isRunning();
    const bool waiting = running && m_controller->stepMode() && m_panel->isStepWaiting();
    m_next->setEnabled(waiting);
    m_finish->setEnabled(waiting);
    m_check->setEnabled(running);
    m_showCheck->setEnabled(m_facts.equivalence.has_value());
}

}  // namespace batchpilot::ui
