#include "ui/session/run_model.h"

#include "ui/session/trainer_controller.h"

namespace batchpilot::ui {

RunModel::RunModel(QObject* parent) : QObject(parent) {}

void RunModel::follow(TrainerController* controller) {
    m_stepMode = controller->stepMode();
    connect(controller, &TrainerController::runStarted, this, &RunModel::runStarted);
    connect(controller, &TrainerController::runFinished, this, &RunModel::runFinished);
    connect(controller, &TrainerController::pausedChanged, this, &RunModel::setPaused);
    connect(controller, &TrainerController::stepModeChanged, this, &RunModel::setStepMode);
    connect(controller, &TrainerController::eventsReceived, this, &RunModel::handle);
}

void RunModel::reset(qint64 targetBatch, const QString& device) {
    m_started = true;
    m_paused = false;
    m_waiting.reset();
    m_state = core::RunState::Idle;
    m_plan = RunPlan{0, 0, targetBatch};
    m_device = device;
    m_digest = {};
    m_probes = m_trainingOoms = 0;
    m_samplesReplayed = m_steps = 0;
    m_trialFailed = false;
}

void RunModel::runStarted(const core::TrainerOptions& options) {
    reset(options.targetBatch, QString::fromStdString(options.device));
    m_running = true;
    m_watching.clear();
    Q_EMIT changed();
}

void RunModel::watchStarted(const QString& folder) {
    reset(0, QString());
    m_running = false;
    m_watching = folder;
    Q_EMIT changed();
}

void RunModel::watchEnded() {
    if (m_watching.isEmpty()) return;
    m_watching.clear();
    Q_EMIT changed();
}

void RunModel::runFinished() {
    m_running = false;
    m_paused = false;
    m_waiting.reset();
    Q_EMIT changed();
}

void RunModel::setPaused(bool paused) {
    if (paused == m_paused) return;
    m_paused = paused && m_running;
    Q_EMIT changed();
}

void RunModel::setStepMode(bool on) {
    if (on == m_stepMode) return;
    m_stepMode = on;
    if (!on) m_waiting.reset();
    Q_EMIT changed();
}

void RunModel::releaseWait() {
    if (!m_waiting) return;
    m_waiting.reset();
    Q_EMIT changed();
}

void RunModel::handle(const QList<core::Event>& events) {
    bool any = false;
    for (const core::Event& event : events) any = apply(event) || any;
    if (any) Q_EMIT changed();
}

bool RunModel::apply(const core::Event& event) {
    m_digest.handle(event);
    if (std::holds_alternative<core::MemorySample>(event)) return false;  // the most frequent, never shown here
    if (const auto* waiting = std::get_if<core::StepModeWaiting>(&event)) {
        m_waiting = *waiting;
    } else if (std::holds_alternative<core::MicroBatchDone>(event)) {
        if (!m_waiting) return false;  // outside step mode: thousands per second, nothing to show
        m_waiting.reset();
    } else if (const auto* oom = std::get_if<core::OomEvent>(&event)) {
        m_waiting.reset();
        if (m_trialFailed) {
            m_trialFailed = false;  // the probe's own trial: how it finds the limit
        } else if (oom->recovered) {
            ++m_trainingOoms;
            if (oom->phase != core::Phase::OptimizerStep) m_samplesReplayed += oom->microBatch;
        }
    } else if (const auto* stepped = std::get_if<core::OptimizerStepped>(&event)) {
        m_waiting.reset();
        m_steps = stepped->step;
    } else if (const auto* state = std::get_if<core::RunStateChanged>(&event)) {
        m_state = state->state;
    } else if (const auto* summary = std::get_if<core::RunSummary>(&event)) {
        if (summary->targetBatch > 0) m_plan.targetBatch = summary->targetBatch;
        if (!summary->device.empty()) m_device = QString::fromStdString(summary->device);
    } else if (const auto* started = std::get_if<core::ProbeStarted>(&event)) {
        if (!started->device.empty()) m_device = QString::fromStdString(started->device);
    } else if (const auto* trial = std::get_if<core::ProbeTrial>(&event)) {
        m_trialFailed = !trial->fit;
    } else if (const auto* finished = std::get_if<core::ProbeFinished>(&event)) {
        m_trialFailed = false;
        ++m_probes;
        m_plan = RunPlan{finished->microBatch, finished->accumulationSteps,
                         finished->targetBatch > 0 ? finished->targetBatch : m_plan.targetBatch};
    } else if (const auto* metrics = std::get_if<core::StepMetrics>(&event)) {
        const RunPlan plan{metrics->microBatch, metrics->accumulationSteps,
                           metrics->targetBatch > 0 ? metrics->targetBatch : m_plan.targetBatch};
        if (plan == m_plan) return false;
        m_plan = plan;
    } else if (const auto* chosen = std::get_if<core::ThroughputChosen>(&event)) {
        m_plan = RunPlan{chosen->microBatch, chosen->accumulationSteps,
                         chosen->targetBatch > 0 ? chosen->targetBatch : m_plan.targetBatch};
    } else if (const auto* changed = std::get_if<core::TargetBatchChanged>(&event)) {
        m_plan.targetBatch = changed->newTarget;
    } else if (const auto* switched = std::get_if<core::DeviceSwitched>(&event)) {
        if (switched->rank != 0) return false;  // several devices: this window's rank is rank 0
        m_device = QString::fromStdString(switched->to);
    } else if (!std::holds_alternative<core::EquivalenceChecked>(event)) {
        return false;
    }
    return true;
}

}  // namespace batchpilot::ui
