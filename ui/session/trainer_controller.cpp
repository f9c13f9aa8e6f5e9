#include "ui/session/trainer_controller.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QProcess>
#include <QTemporaryDir>
#include <QThread>
#include <QTimer>

#include <unistd.h>

#include "core/device/math_libraries.h"
#include "core/config/run_config.h"

// The bridge: the one ui/ file that runs the core trainer (on its own thread).

namespace batchpilot::ui {

/// Trainer events, handed from the worker thread to the GUI thread.
class EventQueue : public core::EventSink {
public:
    void onEvent(const core::Event& event) override {
        const std::lock_guard lock(m_mutex);
        // If the GUI falls far behind (it is busy or blocked), shed the high-rate events that are
        // only drawn, never the ones that tell the story (probe, OOM, steps, errors). Step-by-step
        // micro-batches (the ones that carry their sample indices) are the story: a click waits
        // for each one.
        const auto* micro = std::get_if<core::MicroBatchDone>(&event);
        if (m_events.size() >= kMaxPending &&
            (std::holds_alternative<core::MemorySample>(event) || (micro != nullptr && micro->sampleIndices.empty()))) {
            ++m_dropped;
            return;
        }
        m_events.push_back(event);
    }

    std::vector<core::Event> take() {
        std::vector<core::Event> out;
        const std::lock_guard lock(m_mutex);
        out.swap(m_events);
        return out;
    }

    qint64 dropped() const {
        const std::lock_guard lock(m_mutex);
        return m_dropped;
    }

private:
    static constexpr std::size_t kMaxPending = 200000;
    mutable std::mutex m_mutex;  // guards m_events and m_dropped
    std::vector<core::Event> m_events;
    qint64 m_dropped = 0;
};

/// Lives on the worker thread: runs the trainer the controller built.
class TrainerWorker : public QObject {
    Q_OBJECT
public:
    void run(std::shared_ptr<core::Trainer> trainer, std::shared_ptr<EventQueue> queue) {
        core::RunResult result;
        try {
            result = trainer->run();  // blocks this thread
        } catch (const std::exception& error) {
            // Trainer::run() reports its own errors; this is for anything that escaped anyway,
            // so the window learns about it and a new run can start.
            const std::string message = std::string("the trainer stopped unexpectedly: ") + error.what();
            queue->onEvent(core::ErrorEvent{0, message, "worker thread"});
            result.state = core::RunState::Failed;
            result.error = message;
        }
        Q_EMIT finished(result);
    }

Q_SIGNALS:
    void finished(const batchpilot::core::RunResult& result);
};

TrainerController::TrainerController(QObject* parent)
    : QObject(parent), m_thread(new QThread(this)), m_queue(std::make_shared<EventQueue>()) {
    qRegisterMetaType<core::Event>();
    qRegisterMetaType<core::RunResult>();
    qRegisterMetaType<core::TrainerOptions>();
    m_thread->setObjectName(QStringLiteral("trainer"));
    m_worker = new TrainerWorker;
    m_worker->moveToThread(m_thread);
    connect(m_thread, &QThread::finished, m_worker, &QObject::deleteLater);
    connect(m_worker, &TrainerWorker::finished, this, &TrainerController::onWorkerFinished, Qt::QueuedConnection);
    m_thread->start();

    m_drainTimer = new QTimer(this);
    m_drainTimer->setInterval(33);
    connect(m_drainTimer, &QTimer::timeout, this, &TrainerController::drain);
}

TrainerController::~TrainerController() {
    if (m_trainer) {
        m_trainer->stop();
        m_trainer->resume();
    }
    m_thread->quit();
    m_thread->wait();
    endRanks();
}

bool TrainerController::start(const core::TrainerOptions& options) {
    return start(options, {});
}

QString TrainerController::workerProgram() {
    const QString given = qEnvironmentVariable("BATCHPILOT_CLI");
    if (!given.isEmpty()) return given;
    return QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("batchpilot-cli"));
}

bool TrainerController::startRanks(core::TrainerOptions& options, const QStringList& devices, QString& error) {
    auto store = core::StoreHost::start();
    if (!store) {
        error = QString::fromStdString(store.error());
        return false;
    }
    const QString program = workerProgram();
    if (!QFileInfo(program).isExecutable()) {
        error = tr("the other ranks run %1, which is not there: build batchpilot-cli next to this program, or "
                   "name it in BATCHPILOT_CLI")
                    .arg(program);
        return false;
    }
    // The other ranks read the same run from a configuration file (every field the panel sets).
    m_jobDirectory = std::make_unique<QTemporaryDir>();
    const QString config = m_jobDirectory->filePath(QStringLiteral("job.json"));
    if (auto saved = core::saveRunConfig(config.toStdString(), options); !saved) {
        error = QString::fromStdString(saved.error());
        return false;
    }
    m_store = std::move(*store);
    m_rankDevices = devices;
    const auto world = QString::number(devices.size());
    for (int r = 1; r < devices.size(); ++r) {
        auto* process = new QProcess(this);
        QProcessEnvironment environment = QProcessEnvironment::systemEnvironment();
        for (const auto& [name, value] : core::localRankVariables(r, static_cast<int>(devices.size()), m_store->port(),
                                                                  static_cast<long>(::getpid())))
            environment.insert(QString::fromStdString(name), QString::fromStdString(value));
        process->setProcessEnvironment(environment);
        process->setStandardOutputFile(QProcess::nullDevice());
        // A rank that fails says why on stderr: its last line joins the event log.
        connect(process, &QProcess::finished, this, [this, process, r](int code, QProcess::ExitStatus status) {
            if (status == QProcess::NormalExit && code == 0) return;
            const QStringList lines =
                QString::fromUtf8(process->readAllStandardError()).split(QLatin1Char('\n'), Qt::SkipEmptyParts);
            const QString why = status == QProcess::CrashExit ? tr("crashed") : tr("exited with status %1").arg(code);
            m_queue->onEvent(core::Warning{
                0,
                tr("rank %1 (%2) %3%4")
                    .arg(r)
                    .arg(m_rankDevices.value(r), why, lines.isEmpty() ? QString() : QStringLiteral(": ") + lines.last())
                    .toStdString()});
        });
        process->start(program, {QStringLiteral("--config"), config, QStringLiteral("--device"), devices[r],
                                 QStringLiteral("--rank-timeout"), QString::number(m_rankTimeoutSeconds),
                                 QStringLiteral("--no-run-folder"), QStringLiteral("--quiet")});
        m_ranks.push_back(process);
    }
    core::RankEnvironment rank0;
    rank0.rank = 0;
    rank0.worldSize = static_cast<int>(devices.size());
    rank0.masterAddress = "127.0.0.1";
    rank0.masterPort = m_store->port();
    rank0.agentStore = true;
    // The ranks share this machine's CPUs (each worker takes its part of them, LOCAL_WORLD_SIZE).
    if (options.intraOpThreads == 0)
        options.intraOpThreads =
            core::threadsPerLocalRank(core::intraOpThreadsFor(0, kGuiReservedCpus), static_cast<int>(devices.size()));
    // Joined by the trainer's setup on the worker thread: the window never waits for the ranks.
    options.parallel = core::ProcessGroupLink::deferred(rank0, std::chrono::seconds(m_rankTimeoutSeconds));
    options.device = devices.front().toStdString();
    return true;
}

void TrainerController::endRanks() {
    for (QProcess* process : m_ranks) {
        // They end with rank 0 (at the same batch, or when its connection closes).
        if (process->state() != QProcess::NotRunning && !process->waitForFinished(5000)) {
            process->kill();
            process->waitForFinished(1000);
        }
        process->deleteLater();
    }
    m_ranks.clear();
    m_store.reset();
    m_jobDirectory.reset();
}

bool TrainerController::start(const core::TrainerOptions& options, const QStringList& devices) {
    if (m_running) return false;
    m_running = true;
    m_paused = false;
    m_queue->take();  // anything left from a previous run was delivered already
    m_drainTimer->start();
    core::TrainerOptions runOptions = options;
    runOptions.stepMode = m_stepMode;
    // One norm over the accumulated gradients per micro-batch: small next to the micro-batch's
    // forward and backward pass, and it lets the accumulation view show the gradient growing.
    runOptions.reportGradientNorm = true;
    runOptions.reservedCpus = kGuiReservedCpus;
    if (devices.size() >= 2) {
        QString error;
        if (!startRanks(runOptions, devices, error)) {
            // Never one device in place of several: the run fails, saying why.
            endRanks();
            core::RunResult failed;
            failed.state = core::RunState::Failed;
            failed.badInput = true;
            failed.error = "several devices: " + error.toStdString();
            m_queue->onEvent(core::ErrorEvent{0, failed.error, "configuration"});
            Q_EMIT runStarted(runOptions);
            drain();
            m_drainTimer->stop();
            m_running = false;
            Q_EMIT runFinished(failed);
            return true;
        }
    }
    // The run's folder, fed from drain() on this thread (the trainer thread never waits for it).
    // Made first: checkpoints asked for without a directory (keeping the best model) go into it.
    m_folder.reset();
    m_folderPath.clear();
    const std::string runs = m_runsDirectory.isEmpty() ? core::defaultRunsDirectory() : m_runsDirectory.toStdString();
    QString folderError;
    if (auto folder = core::RunFolder::create(runs, runOptions)) {
        m_folder = std::move(*folder);
        m_folderPath = QString::fromStdString(m_folder->path());
    } else {
        folderError = QString::fromStdString(folder.error());
    }
    // Built here, so that every command from now on goes to it (its mailbox keeps what arrives
    // before run() starts); it runs, and sends its events, on the worker thread.
    m_trainer = std::make_shared<core::Trainer>(runOptions, *m_queue);
    Q_EMIT runRecorded(m_folderPath, folderError);
    QMetaObject::invokeMethod(
        m_worker, [worker = m_worker, trainer = m_trainer, queue = m_queue] { worker->run(trainer, queue); },
        Qt::QueuedConnection);
    Q_EMIT runStarted(runOptions);
    return true;
}

void TrainerController::pause() {
    if (!m_running || m_paused) return;
    // With several devices every rank pauses at the next training batch (core: holdWhilePaused).
    m_trainer->pause();
    m_paused = true;
    Q_EMIT pausedChanged(true);
}

void TrainerController::resume() {
    if (!m_running || !m_paused) return;
    m_trainer->resume();
    m_paused = false;
    Q_EMIT pausedChanged(false);
}

void TrainerController::stop() {
    if (!m_running) return;
    m_trainer->stop();  // also ends a pause: the trainer sees the stop at once
    if (m_paused) {
        m_paused = false;
        Q_EMIT pausedChanged(false);
    }
}

void TrainerController::setTargetBatch(qint64 target, core::LrScaling rule) {
    if (m_running) m_trainer->setTargetBatch(target, rule);
}

void TrainerController::reprobe() {
    if (m_running) m_trainer->reprobe();
}

void TrainerController::surveySavers() {
    if (m_running) m_trainer->surveySavers();
}

void TrainerController::setMemorySavers(core::MemorySavers savers) {
    if (m_running) m_trainer->setMemorySavers(savers);
}

void TrainerController::switchDevice(const QString& device, int rank) {
    if (m_running) m_trainer->switchDevice(device.toStdString(), rank);
}

void TrainerController::setStepMode(bool on) {
    if (on == m_stepMode) return;
    m_stepMode = on;
    if (m_running) m_trainer->setStepMode(on);
    Q_EMIT stepModeChanged(on);
}

void TrainerController::advance() {
    if (m_running) m_trainer->advance();
}

void TrainerController::finishBatch() {
    if (m_running) m_trainer->finishBatch();
}

void TrainerController::checkEquivalence(qint64 samples) {
    if (m_running) m_trainer->checkEquivalence(samples);
}

void TrainerController::setDrainInterval(int milliseconds) {
    m_drainTimer->setInterval(milliseconds);
}

qint64 TrainerController::droppedEvents() const {
    return m_queue->dropped();
}

QStringList TrainerController::builtinModelNames() {
    QStringList names;
    for (const std::string& name : core::builtinModelNames()) names << QString::fromStdString(name);
    return names;
}

void TrainerController::drain() {
    std::vector<core::Event> events = m_queue->take();
    if (events.empty()) return;
    if (m_folder) {
        const bool failedBefore = !m_folder->error().empty();
        for (const core::Event& event : events) m_folder->onEvent(event);
        if (!failedBefore && !m_folder->error().empty())
            Q_EMIT runRecorded(m_folderPath, QString::fromStdString(m_folder->error()));
    }
    QList<core::Event> batch;
    batch.reserve(static_cast<qsizetype>(events.size()));
    for (core::Event& event : events) batch.append(std::move(event));
    Q_EMIT eventsReceived(batch);
}

void TrainerController::onWorkerFinished(const core::RunResult& result) {
    drain();  // deliver the last events before saying the run is over
    m_drainTimer->stop();
    if (m_folder) {
        const bool failedBefore = !m_folder->error().empty();
        m_folder->flush();
        if (!failedBefore && !m_folder->error().empty())
            Q_EMIT runRecorded(m_folderPath, QString::fromStdString(m_folder->error()));
        m_folder.reset();
    }
    m_running = false;
    endRanks();
    m_trainer.reset();  // the worker has let go of it: its model and tensors are freed here
    if (m_paused) {
        m_paused = false;
        Q_EMIT pausedChanged(false);
    }
    Q_EMIT runFinished(result);
}

}  // namespace batchpilot::ui

#include "trainer_controller.moc"
