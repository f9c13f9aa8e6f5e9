#include "ui/session/run_watcher.h"

#include <chrono>
#include <utility>

#include <QDir>
#include <QElapsedTimer>
#include <QFileInfo>
#include <QLocale>
#include <QTimer>

#include "core/events/event_file.h"

namespace batchpilot::ui {
namespace {

/// Events waiting for the GUI at most: the reader waits beyond (a few tens of MB at most).
constexpr size_t kMaxQueued = 50000;
/// Bytes the reader reads at a time (about 10,000 events).
constexpr size_t kReadBytes = size_t{2} << 20;
/// An incomplete last line is said once the file has not grown for this long.
constexpr qint64 kPendingQuietMs = 2000;
/// A run that has written nothing for this long and no end may have been killed.
constexpr qint64 kSilentMs = 60000;

QString megabytes(qint64 bytes) {
    return QLocale::c().toString(static_cast<double>(bytes) / 1e6, 'f', bytes < 10000000 ? 2 : 1) +
           QStringLiteral(" MB");
}

}  // namespace

/// What the reader thread and the GUI thread share, under its mutex.
struct RunWatcher::Shared {
    std::mutex mutex;
    std::condition_variable wake;  ///< the reader waits on it: for room in the queue, or to poll again
    bool stop = false;
    std::deque<core::Event> events;
    QStringList skipped;  ///< descriptions of skipped lines not yet said
    bool atEnd = false;   ///< the last read reached the end of the file
    qint64 bytesRead = 0;
    qint64 fileBytes = 0;
    qint64 skippedLines = 0;
    qint64 pendingBytes = 0;
    std::string error;
    int pollMilliseconds = 500;
};

RunWatcher::RunWatcher(QObject* parent) : QObject(parent), m_timer(new QTimer(this)) {
    m_timer->setInterval(33);
    connect(m_timer, &QTimer::timeout, this, &RunWatcher::deliver);
}

RunWatcher::~RunWatcher() {
    stopReader();
}

QString RunWatcher::whyNotARun(const QString& folder) {
    const QFileInfo info(folder);
    const QString events = QDir(folder).filePath(QStringLiteral("events.jsonl"));
    QString why;
    if (!info.exists())
        why = tr("%1 does not exist: choose a run folder (one of those under the runs directory, or one a "
                 "batchpilot-cli run wrote; mounted folders work too)")
                  .arg(folder);
    else if (!info.isDir())
        why = tr("%1 is not a folder: choose the run's folder, the one that holds its events.jsonl").arg(folder);
    else if (!QFileInfo(events).isFile())
        why = tr("%1 is not a run folder: it has no events.jsonl (run folders are what every run writes under the "
                 "runs directory; a run started with --no-run-folder has none)")
                  .arg(folder);
    else if (!QFileInfo(events).isReadable())
        why = tr("%1 cannot be read: check its permissions").arg(events);
    return why;
}

bool RunWatcher::open(const QString& folder, QString* error) {
    close();
    if (const QString why = whyNotARun(folder); !why.isEmpty()) {
        if (error) *error = why;
        return false;
    }
    const QString events = QDir(folder).filePath(QStringLiteral("events.jsonl"));
    m_folder = QDir(folder).absolutePath();
    m_error.clear();
    m_caughtUp = m_ended = m_saidPending = m_silent = false;
    m_bytesRead = m_fileBytes = m_events = m_skippedLines = m_pendingBytes = 0;
    m_quietPolls = 0;
    m_shared = std::make_shared<Shared>();
    m_shared->pollMilliseconds = m_pollMilliseconds;
    m_reader = std::thread([shared = m_shared, path = events.toStdString()] {
        core::EventFileFollower follower(path);
        std::unique_lock lock(shared->mutex);
        while (!shared->stop) {
            shared->wake.wait(lock, [&] { return shared->stop || shared->events.size() < kMaxQueued; });
            if (shared->stop) break;
            lock.unlock();
            auto batch = follower.read(kReadBytes);
            lock.lock();
            if (!batch) {
                shared->error = batch.error();
                break;
            }
            for (core::Event& event : batch->events) shared->events.push_back(std::move(event));
            for (const std::string& line : batch->skipped) shared->skipped << QString::fromStdString(line);
            shared->bytesRead = follower.bytesRead();
            shared->fileBytes = follower.fileBytes();
            shared->skippedLines = follower.skippedLines();
            shared->pendingBytes = follower.pendingBytes();
            shared->atEnd = batch->atEnd;
            if (batch->atEnd)
                shared->wake.wait_for(lock, std::chrono::milliseconds(shared->pollMilliseconds),
                                      [&] { return shared->stop; });
        }
    });
    m_timer->start();
    Q_EMIT stateChanged();
    return true;
}

void RunWatcher::close() {
    stopReader();
    m_timer->stop();
    if (m_folder.isEmpty()) return;
    m_folder.clear();
    Q_EMIT stateChanged();
}

void RunWatcher::stopReader() {
    if (m_shared) {
        {
            const std::lock_guard lock(m_shared->mutex);
            m_shared->stop = true;
        }
        m_shared->wake.notify_all();
    }
    if (m_reader.joinable()) m_reader.join();
    m_shared.reset();
}

void RunWatcher::deliver() {
    if (!m_shared) return;
    QList<core::Event> events;
    QStringList skipped;
    bool atEnd = false;
    bool more = false;
    qint64 fileBytes = 0;
    std::string error;
    {
        const std::lock_guard lock(m_shared->mutex);
        const size_t count = std::min(m_shared->events.size(), static_cast<size_t>(m_maxPerDelivery));
        events.reserve(static_cast<qsizetype>(count));
        for (size_t i = 0; i < count; ++i) {
            events.push_back(std::move(m_shared->events.front()));
            m_shared->events.pop_front();
        }
        more = !m_shared->events.empty();
        skipped.swap(m_shared->skipped);
        atEnd = m_shared->atEnd && !more;
        fileBytes = m_shared->fileBytes;
        m_bytesRead = m_shared->bytesRead;
        m_skippedLines = m_shared->skippedLines;
        m_pendingBytes = m_shared->pendingBytes;
        error = m_shared->error;
    }
    m_shared->wake.notify_all();  // room in the queue again

    bool changed = !events.isEmpty() || !skipped.isEmpty();
    if (fileBytes != m_fileBytes) {
        m_fileBytes = fileBytes;
        m_quietPolls = 0;
        changed = true;
    } else {
        ++m_quietPolls;
    }
    m_events += events.size();
    for (const core::Event& event : events) {
        if (const auto* state = std::get_if<core::RunStateChanged>(&event))
            m_ended = state->state == core::RunState::Finished || state->state == core::RunState::Failed;
    }
    if (!events.isEmpty()) Q_EMIT eventsReceived(events);
    for (const QString& line : std::as_const(skipped)) Q_EMIT problem(tr("events.jsonl, %1: skipped").arg(line));
    if (atEnd && !m_caughtUp) {
        m_caughtUp = true;
        changed = true;
    }
    // An incomplete last line: the run is writing it, or was killed while it wrote it.
    const qint64 quietMs = static_cast<qint64>(m_quietPolls) * m_timer->interval();
    if (m_pendingBytes > 0 && atEnd && quietMs >= kPendingQuietMs && !m_saidPending) {
        m_saidPending = true;
        Q_EMIT problem(tr("events.jsonl ends in an incomplete line (%1 bytes): skipped until the rest of it arrives "
                          "(a run killed while writing leaves one)")
                           .arg(m_pendingBytes));
    } else if (m_pendingBytes == 0) {
        m_saidPending = false;
    }
    if (!error.empty()) {
        m_error = QString::fromStdString(error);
        m_timer->stop();
        Q_EMIT problem(tr("stopped reading the run: %1").arg(m_error));
        changed = true;
    }
    if (m_fileBytes == fileBytes && m_quietPolls == 0) m_silent = false;
    if (m_caughtUp && !m_ended && quietMs >= kSilentMs && !m_silent) {
        m_silent = true;  // said once, until the file grows again
        changed = true;
    }
    if (changed) Q_EMIT stateChanged();
    // Behind: deliver the rest as soon as the GUI has drawn this batch.
    if (more && m_timer->isActive()) QTimer::singleShot(0, this, &RunWatcher::deliver);
}

QString RunWatcher::stateText() const {
    if (m_folder.isEmpty()) return {};
    const QString name = QFileInfo(m_folder).fileName();
    if (!m_error.isEmpty()) return tr("%1: stopped reading (%2)").arg(name, m_error);
    const QString events = QLocale().toString(m_events);
    if (!m_caughtUp) {
        const int percent = m_fileBytes > 0 ? static_cast<int>(100.0 * m_bytesRead / m_fileBytes) : 0;
        return tr("%1: reading, %2% (%3 of %4)")
            .arg(name)
            .arg(percent)
            .arg(megabytes(m_bytesRead), megabytes(m_fileBytes));
    }
    if (m_ended) return tr("%1: the run ended (%2 events)").arg(name, events);
    if (m_silent)
        return tr("%1: following, but nothing new for over a minute (%2 events): the run may be paused or waiting, "
                  "or have been killed (a killed run writes no end)")
            .arg(name, events);
    return tr("%1: following live (%2 events)").arg(name, events);
}

}  // namespace batchpilot::ui
