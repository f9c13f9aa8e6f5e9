#pragma once

#include <optional>

#include <QList>
#include <QObject>
#include <QString>

#include "core/events/events.h"
#include "core/plan/memory_report.h"
#include "core/config/options.h"
#include "ui/session/event_metatypes.h"

namespace batchpilot::ui {

class TrainerController;

/// How the run reaches its target batch: micro-batch × accumulation steps = target batch.
struct RunPlan {
    qint64 microBatch = 0;         ///< 0 until a probe finished or a step ran
    qint64 accumulationSteps = 0;  ///< micro-batches per training batch
    qint64 targetBatch = 0;        ///< the batch the trainer aims at now

    bool operator==(const RunPlan&) const = default;
};

/// The current (or last) run as the GUI shows it: the one place every widget reads whether a run
/// is going, paused, in step mode and waiting, its target batch and plan, its device, and what it
/// reported (core's RunDigest, plus the counts that Help > How this works explains).
///
/// Kept on the GUI thread from two inputs: the controller's signals (a run started or ended, pause,
/// step mode; follow() connects them) and the trainer's events (handle()). Tests may call the
/// slots directly. changed() is emitted once per input that changed anything; widgets then read
/// what they show. Cheap per event: a few fields.
class RunModel : public QObject {
    Q_OBJECT
public:
    explicit RunModel(QObject* parent = nullptr);

    /// Takes its inputs from `controller` (connects to its signals).
    void follow(TrainerController* controller);

    bool isRunning() const { return m_running; }
    /// Paused by the user (from the command until Resume or the run's end).
    bool isPaused() const { return m_paused; }
    /// Step by step is on (also between runs: the next run starts in it).
    bool stepMode() const { return m_stepMode; }
    /// Step by step: the micro-batch the trainer waits to run; empty while it runs.
    const std::optional<core::StepModeWaiting>& waiting() const { return m_waiting; }
    /// The trainer waits for Next micro-batch or Finish batch.
    bool isWaiting() const { return m_running && m_stepMode && m_waiting.has_value(); }
    /// What the trainer reported it is doing (Idle before a run).
    core::RunState state() const { return m_state; }
    const RunPlan& plan() const { return m_plan; }
    qint64 targetBatch() const { return m_plan.targetBatch; }
    /// The device the run uses (the options' until the trainer reports one, then after switches).
    const QString& device() const { return m_device; }

    /// Everything the run reported that the memory report also reads.
    const core::RunDigest& digest() const { return m_digest; }
    /// Probes finished in this run.
    int probes() const { return m_probes; }
    /// Out-of-memory errors while training (all recovered); a probe's failed trials do not count.
    int trainingOoms() const { return m_trainingOoms; }
    /// Samples of failed micro-batches that were run again, smaller.
    qint64 samplesReplayed() const { return m_samplesReplayed; }
    /// Optimizer steps done.
    qint64 steps() const { return m_steps; }
    /// The run shown is read from a run folder (RunWatcher): another process trains it, and this
    /// window cannot steer it. isRunning() is false while watching.
    bool isWatching() const { return !m_watching.isEmpty(); }
    const QString& watchedFolder() const { return m_watching; }
    /// A run started (this model saw it) or reported anything worth explaining.
    bool hasRun() const { return m_started || m_digest.summary || m_digest.probeFinished; }

public Q_SLOTS:
    /// A run starts with `options`: everything of the last run is forgotten.
    void runStarted(const batchpilot::core::TrainerOptions& options);
    /// The run in `folder` is shown from now on, read from its events: everything of the last run is
    /// forgotten, as at runStarted, but no run of this window's is going.
    void watchStarted(const QString& folder);
    /// The run in the folder is no longer read (its facts stay for the report).
    void watchEnded();
    /// The run ended: not running, not paused, not waiting (its facts stay for the report).
    void runFinished();
    void setPaused(bool paused);
    void setStepMode(bool on);
    /// A command let the waiting trainer go on (Next micro-batch, Finish batch).
    void releaseWait();
    void handle(const QList<batchpilot::core::Event>& events);

Q_SIGNALS:
    void changed();

private:
    void reset(qint64 targetBatch, const QString& device);
    /// True when the event changed what the model shows.
    bool apply(const core::Event& event);

    QString m_watching;
    bool m_started = false;
    bool m_running = false;
    bool m_paused = false;
    bool m_stepMode = false;
    std::optional<core::StepModeWaiting> m_waiting;
    core::RunState m_state = core::RunState::Idle;
    RunPlan m_plan;
    QString m_device;
    core::RunDigest m_digest;
    int m_probes = 0;
    int m_trainingOoms = 0;
    qint64 m_samplesReplayed = 0;
    qint64 m_steps = 0;
    bool m_trialFailed = false;  // a probe trial just failed: its OomEvent is the probe's, not training's
};

}  // namespace batchpilot::ui
