#include "ui/trainer_controller.h"

#include <exception>
#include <optional>
#include <utility>

#include <QThread>
#include <QTimer>

// The bridge: the one ui/ file that runs the core trainer (on its own thread).

namespace batchpilot::ui {

/// Trainer events, handed from the worker thread to the GUI thread.
class EventQueue : public core::EventSink {
public:
    void onEvent(const core::Event& event) override
    {
        const std::lock_guard lock(m_mutex);
        // If the GUI falls far behind (it is busy or blocked), shed the high-rate events that are
        // only drawn, never the ones that tell the story (probe, OOM, steps, errors). Step-by-step
        // micro-batches (the ones that carry their sample indices) are the story: a click waits
        // for each one.
        const auto* micro = std::get_if<core::MicroBatchDone>(&event);
        if (m_events.size() >= kMaxPending &&
            (std::holds_alternative<core::MemorySample>(event) ||
             (micro != nullptr && micro->sampleIndices.empty()))) {
            ++m_dropped;
            return;
        }
        m_events.push_back(event);
    }

    std::vector<core::Event> take()
    {
        std::vector<core::Event> out;
        const std::lock_guard lock(m_mutex);
        out.swap(m_events);
        return out;
    }

    qint64 dropped() const
    {
        const std::lock_guard lock(m_mutex);
        return m_dropped;
    }

    /// Calls `command` with the trainer of the current run, if there is one. The trainer's
    /// command methods are thread-safe; the lock only keeps the trainer alive during the call
    /// (it is never held while the trainer sends an event, so there is no lock cycle).
    template <class Command>
    bool withTrainer(Command command)
    {
        const std::lock_guard lock(m_trainerMutex);
        if (!m_trainer)
            return false;
        command(*m_trainer);
        return true;
    }

    /// Sets or clears the trainer of the current run (worker thread). Clearing destroys it here,
    /// on the thread that owns its tensors.
    void setTrainer(std::unique_ptr<core::Trainer> trainer)
    {
        const std::lock_guard lock(m_trainerMutex);
        m_trainer = std::move(trainer);
        // Commands given before the trainer existed.
        if (m_trainer && m_pendingStop)
            m_trainer->stop();
        if (m_trainer && m_pendingPause)
            m_trainer->pause();
        if (m_trainer && m_pendingStepMode)
            m_trainer->setStepMode(*m_pendingStepMode);
        if (m_trainer && m_pendingEquivalence)
            m_trainer->checkEquivalence(*m_pendingEquivalence);
        m_pendingStop = m_pendingPause = false;
        m_pendingStepMode.reset();
        m_pendingEquivalence.reset();
    }

    core::Trainer* trainer()
    {
        const std::lock_guard lock(m_trainerMutex);
        return m_trainer.get();
    }

    void requestStop()
    {
        if (!withTrainer([](core::Trainer& t) { t.stop(); })) {
            const std::lock_guard lock(m_trainerMutex);
            m_pendingStop = true;
        }
    }

    void requestPause(bool pause)
    {
        if (!withTrainer([pause](core::Trainer& t) { pause ? t.pause() : t.resume(); })) {
            const std::lock_guard lock(m_trainerMutex);
            m_pendingPause = pause;
        }
    }

    void requestStepMode(bool on)
    {
        // One lock for both cases: a toggle cannot fall between the trainer's creation and its
        // pending commands.
        const std::lock_guard lock(m_trainerMutex);
        if (m_trainer)
            m_trainer->setStepMode(on);
        else
            m_pendingStepMode = on;
    }

    void requestEquivalence(qint64 samples)
    {
        const std::lock_guard lock(m_trainerMutex);
        if (m_trainer)
            m_trainer->checkEquivalence(samples);
        else
            m_pendingEquivalence = samples;
    }

    void resetPending()
    {
        const std::lock_guard lock(m_trainerMutex);
        m_pendingStop = m_pendingPause = false;
        m_pendingStepMode.reset();
        m_pendingEquivalence.reset();
    }

private:
    static constexpr std::size_t kMaxPending = 200000;
    mutable std::mutex m_mutex;  // guards m_events and m_dropped
    std::vector<core::Event> m_events;
    qint64 m_dropped = 0;
    std::mutex m_trainerMutex;   // guards the trainer pointer and the pending commands
    std::unique_ptr<core::Trainer> m_trainer;
    bool m_pendingStop = false;
    bool m_pendingPause = false;
    std::optional<bool> m_pendingStepMode;  // toggled after start() but before the trainer existed
    std::optional<qint64> m_pendingEquivalence;  // asked for in that moment too
};

/// Lives on the worker thread: builds the trainer and runs it.
class TrainerWorker : public QObject {
    Q_OBJECT
public:
    explicit TrainerWorker(std::shared_ptr<EventQueue> queue) : m_queue(std::move(queue)) {}

    void run(const core::TrainerOptions& options)
    {
        core::RunResult result;
        try {
            m_queue->setTrainer(std::make_unique<core::Trainer>(options, *m_queue));
            // run() blocks this thread; the GUI reaches the trainer through withTrainer().
            result = m_queue->trainer()->run();
            m_queue->setTrainer(nullptr);
        } catch (const std::exception& error) {
            // Trainer::run() reports its own errors; this is for anything that escaped anyway,
            // so the window learns about it and a new run can start.
            m_queue->setTrainer(nullptr);
            const std::string message =
                std::string("the trainer stopped unexpectedly: ") + error.what();
            m_queue->onEvent(core::ErrorEvent{0, message, "worker thread"});
            result.state = core::RunState::Failed;
            result.error = message;
        }
        Q_EMIT finished(result);
    }

Q_SIGNALS:
    void finished(const batchpilot::core::RunResult& result);

private:
    std::shared_ptr<EventQueue> m_queue;
};

TrainerController::TrainerController(QObject* parent)
    : QObject(parent),
      m_thread(new QThread(this)),
      m_queue(std::make_shared<EventQueue>())
{
    qRegisterMetaType<core::Event>();
    qRegisterMetaType<core::RunResult>();
    qRegisterMetaType<core::TrainerOptions>();
    m_thread->setObjectName(QStringLiteral("trainer"));
    m_worker = new TrainerWorker(m_queue);
    m_worker->moveToThread(m_thread);
    connect(m_thread, &QThread::finished, m_worker, &QObject::deleteLater);
    connect(m_worker, &TrainerWorker::finished, this, &TrainerController::onWorkerFinished,
            Qt::QueuedConnection);
    m_thread->start();

    m_drainTimer = new QTimer(this);
    m_drainTimer->setInterval(33);
    connect(m_drainTimer, &QTimer::timeout, this, &TrainerController::drain);
}

TrainerController::~TrainerController()
{
    m_queue->requestStop();
    m_queue->requestPause(false);
    m_thread->quit();
    m_thread->wait();
}

bool TrainerController::start(const core::TrainerOptions& options)
{
    if (m_running)
        return false;
    m_running = true;
    m_paused = false;
    m_queue->resetPending();
    m_queue->take();  // anything left from a previous run was delivered already
    m_drainTimer->start();
    core::TrainerOptions runOptions = options;
    runOptions.stepMode = m_stepMode;
    // One norm over the accumulated gradients per micro-batch: small next to the micro-batch's
    // forward and backward pass, and it lets the accumulation view show the gradient growing.
    runOptions.reportGradientNorm = true;
    runOptions.reservedCpus = kGuiReservedCpus;
    QMetaObject::invokeMethod(m_worker, [worker = m_worker, runOptions] { worker->run(runOptions); },
                              Qt::QueuedConnection);
    Q_EMIT runStarted();
    return true;
}

void TrainerController::pause()
{
    if (!m_running || m_paused)
        return;
    m_queue->requestPause(true);
    m_paused = true;
    Q_EMIT pausedChanged(true);
}

void TrainerController::resume()
{
    if (!m_running || !m_paused)
        return;
    m_queue->requestPause(false);
    m_paused = false;
    Q_EMIT pausedChanged(false);
}

void TrainerController::stop()
{
    if (!m_running)
        return;
    m_queue->requestStop();
    // A paused trainer must wake up to see the stop.
    m_queue->requestPause(false);
    if (m_paused) {
        m_paused = false;
        Q_EMIT pausedChanged(false);
    }
}

void TrainerController::setTargetBatch(qint64 target, core::LrScaling rule)
{
    m_queue->withTrainer([&](core::Trainer& t) { t.setTargetBatch(target, rule); });
}

void TrainerController::reprobe()
{
    m_queue->withTrainer([](core::Trainer& t) { t.reprobe(); });
}

void TrainerController::switchDevice(const QString& device)
{
    const std::string id = device.toStdString();
    m_queue->withTrainer([&](core::Trainer& t) { t.switchDevice(id); });
}

void TrainerController::setStepMode(bool on)
{
    m_stepMode = on;
    if (m_running)
        m_queue->requestStepMode(on);
}

void TrainerController::advance()
{
    m_queue->withTrainer([](core::Trainer& t) { t.advance(); });
}

void TrainerController::finishBatch()
{
    m_queue->withTrainer([](core::Trainer& t) { t.finishBatch(); });
}

void TrainerController::checkEquivalence(qint64 samples)
{
    if (m_running)
        m_queue->requestEquivalence(samples);
}

void TrainerController::setDrainInterval(int milliseconds)
{
    m_drainTimer->setInterval(milliseconds);
}

qint64 TrainerController::droppedEvents() const
{
    return m_queue->dropped();
}

QStringList TrainerController::builtinModelNames()
{
    QStringList names;
    for (const std::string& name : core::builtinModelNames())
        names << QString::fromStdString(name);
    return names;
}

void TrainerController::drain()
{
    std::vector<core::Event> events = m_queue->take();
    if (events.empty())
        return;
    QList<core::Event> batch;
    batch.reserve(static_cast<qsizetype>(events.size()));
    for (core::Event& event : events)
        batch.append(std::move(event));
    Q_EMIT eventsReceived(batch);
}

void TrainerController::onWorkerFinished(const core::RunResult& result)
{
    drain();  // deliver the last events before saying the run is over
    m_drainTimer->stop();
    m_running = false;
    if (m_paused) {
        m_paused = false;
        Q_EMIT pausedChanged(false);
    }
    Q_EMIT runFinished(result);
}

}  // namespace batchpilot::ui

#include "trainer_controller.moc"
