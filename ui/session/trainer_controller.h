#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <QList>
#include <QObject>
#include <QStringList>

#include "core/events/events.h"
#include "core/config/options.h"
#include "core/distributed/process_group.h"
#include "core/records/run_folder.h"
#include "core/train/trainer.h"
#include "ui/session/event_metatypes.h"

class QProcess;
class QTemporaryDir;
class QThread;
class QTimer;

namespace batchpilot::ui {

class EventQueue;
class TrainerWorker;

/// Runs a core::Trainer on a worker thread and hands its events to the GUI.
///
/// start() constructs the Trainer here, on the GUI thread, so that every command has one path
/// (the trainer's own thread-safe mailbox) and none is lost before the run begins; the worker
/// thread, a QThread owned by the controller (moveToThread, not a subclass), blocks in run(). The trainer's events land
/// in a mutex-protected queue; a ~30 Hz timer on the GUI thread drains it and emits them as one batch, so the GUI does
/// the same small amount of work per frame however many thousand events per second arrive.
/// Commands go straight to the Trainer's thread-safe methods and never block; outside a run they
/// do nothing (step mode is remembered for the next run). Widgets do not call them: RunCommands
/// does, and RunModel keeps what they and the trainer's events say for widgets to read.
///
/// Thread rules: create and use on the GUI thread. The destructor stops a running trainer and
/// waits for the worker thread.
class TrainerController : public QObject {
    Q_OBJECT
public:
    /// CPUs a run started here leaves to the GUI thread when it picks its intra-op threads
    /// (core::intraOpThreadsFor): drawing the charts takes about half a core.
    static constexpr int kGuiReservedCpus = 1;

    explicit TrainerController(QObject* parent = nullptr);
    ~TrainerController() override;

    /// Starts a run; false (and nothing happens) while one is still running. GUI runs report the
    /// running gradient norm of every micro-batch (for the accumulation view) and start in step
    /// mode when setStepMode(true) was called.
    bool start(const core::TrainerOptions& options);
    /// Several devices (docs/guide/several-devices.md): `devices` (two or more, in rank order) share
    /// every training batch, one process each. This window trains rank 0 on devices[0] (the
    /// events, charts and run folder are its own, and RanksStepped carries every rank's numbers);
    /// the other ranks are workerProgram() processes, joined through a store hosted here. Every
    /// command (pause, target batch, device switch of any rank, memory savers, the equivalence
    /// check) is agreed by every rank at the same training batch.
    bool start(const core::TrainerOptions& options, const QStringList& devices);
    /// The program the other ranks run: $BATCHPILOT_CLI when set, else batchpilot-cli next to
    /// this program.
    static QString workerProgram();
    bool isRunning() const { return m_running; }

    void pause();
    void resume();
    void stop();
    void setTargetBatch(qint64 target, core::LrScaling rule);
    void reprobe();
    /// With several devices, `rank` names the rank that moves (the others agree at the same batch).
    void switchDevice(const QString& device, int rank = 0);

    /// Step-by-step mode (teaching): the trainer waits before each micro-batch. The setting is
    /// remembered: a run started while it is on starts in step mode.
    void setStepMode(bool on);
    bool stepMode() const { return m_stepMode; }
    /// Step-by-step mode: runs exactly one more micro-batch.
    void advance();
    /// Step-by-step mode: runs the rest of the current batch and its optimizer step.
    void finishBatch();
    /// Compares accumulation with one full pass at the next training-batch boundary (the last
    /// batch, or its first `samples` samples when 0 < samples < its size).
    void checkEquivalence(qint64 samples);
    /// Measures every memory saver at the next training-batch boundary (core::SaverSurvey).
    void surveySavers();
    /// Uses `savers` from the next training batch on, with a new probe.
    void setMemorySavers(core::MemorySavers savers);

    /// Where each run's folder goes (core::RunFolder: config.json, events.jsonl, summary.json);
    /// empty (the default): core::defaultRunsDirectory().
    void setRunsDirectory(const QString& directory) { m_runsDirectory = directory; }
    /// The folder of the current or last run; empty when none was written.
    QString runFolder() const { return m_folderPath; }

    /// Several devices: how long a rank waits for the others to join, or in a collective, before
    /// the job stops naming the rank that did not answer (default 60 s; a pause does not count).
    void setRankTimeout(int seconds) { m_rankTimeoutSeconds = seconds; }

    /// Milliseconds between drains of the event queue (default 33).
    void setDrainInterval(int milliseconds);
    /// Events dropped because the GUI fell far behind (memory samples and micro-batch events
    /// outside step-by-step mode only; nothing else is ever dropped).
    qint64 droppedEvents() const;

    /// Names of the built-in models ("mlp", "cnn", ...).
    static QStringList builtinModelNames();

Q_SIGNALS:
    /// A batch of events in the order the trainer sent them (GUI thread, at most ~30 per second).
    void eventsReceived(const QList<batchpilot::core::Event>& events);
    /// A run started with `options` (as the trainer got them: step mode and CPUs settled here).
    void runStarted(const batchpilot::core::TrainerOptions& options);
    /// The run ended; every event it sent has been delivered before this signal.
    void runFinished(const batchpilot::core::RunResult& result);
    void pausedChanged(bool paused);
    /// Where the run is recorded (`path`), or why it is not (`error`); sent at the start, and
    /// again when a write failed during the run.
    void runRecorded(const QString& path, const QString& error);
    void stepModeChanged(bool on);

private:
    void drain();
    void onWorkerFinished(const core::RunResult& result);

    QThread* m_thread;
    TrainerWorker* m_worker;
    QTimer* m_drainTimer;
    /// Several devices: starts ranks 1… (false, with `error`, when one cannot start).
    bool startRanks(core::TrainerOptions& options, const QStringList& devices, QString& error);
    /// After the run: gives the other ranks a moment to end, then ends them.
    void endRanks();
    std::unique_ptr<core::StoreHost> m_store;       ///< several devices: the job's store
    std::unique_ptr<QTemporaryDir> m_jobDirectory;  ///< several devices: the job's configuration file
    std::vector<QProcess*> m_ranks;                 ///< several devices: ranks 1…, in order
    QStringList m_rankDevices;
    std::shared_ptr<EventQueue> m_queue;
    std::shared_ptr<core::Trainer> m_trainer;   ///< the current run's, from start() to runFinished
    std::unique_ptr<core::RunFolder> m_folder;  ///< the current run's folder, fed on the GUI thread
    QString m_runsDirectory;
    QString m_folderPath;
    int m_rankTimeoutSeconds = 60;
    bool m_running = false;
    bool m_paused = false;
    bool m_stepMode = false;
};

}  // namespace batchpilot::ui
