#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include <QList>
#include <QObject>
#include <QString>
#include <QStringList>

#include "core/events/events.h"
#include "ui/session/event_metatypes.h"

class QTimer;

namespace batchpilot::ui {

/// Shows a run this window did not start: reads a run folder's events.jsonl (core's
/// EventFileFollower) on a reader thread from its start, and hands its events to the GUI in the
/// order the run wrote them, as TrainerController hands a live run's — the same views fill the
/// same way. While the file grows (the run goes on, here or on a machine whose folder is mounted
/// here) the new events follow, read every pollInterval(). Nothing is dropped: when the GUI falls
/// behind, the reader waits (memory stays bounded whatever the file holds).
///
/// Thread rules: create and use on the GUI thread; the destructor stops the reader thread.
class RunWatcher : public QObject {
    Q_OBJECT
public:
    explicit RunWatcher(QObject* parent = nullptr);
    ~RunWatcher() override;

    /// Starts reading `folder` (a run folder: it holds events.jsonl); false, with `error` saying
    /// what is wrong and what to do, when it cannot be read. A folder already open is closed first.
    bool open(const QString& folder, QString* error = nullptr);
    /// Why `folder` cannot be shown (it does not exist, has no events.jsonl, …) and what to do;
    /// empty when it can.
    static QString whyNotARun(const QString& folder);
    /// Stops reading; the events delivered stay where they went.
    void close();
    bool isOpen() const { return !m_folder.isEmpty(); }
    QString folder() const { return m_folder; }

    /// Everything the file held when it was opened was delivered (later lines follow as they come).
    bool caughtUp() const { return m_caughtUp; }
    /// The run wrote its end (state finished or failed).
    bool runEnded() const { return m_ended; }
    /// Bytes of the events file delivered, and its size when last read.
    qint64 bytesRead() const { return m_bytesRead; }
    qint64 fileBytes() const { return m_fileBytes; }
    /// Events delivered since open().
    qint64 events() const { return m_events; }
    /// Lines of the file skipped (not events), and the bytes of an incomplete last line held back.
    qint64 skippedLines() const { return m_skippedLines; }
    qint64 pendingBytes() const { return m_pendingBytes; }
    /// The reading stopped on an error (file removed, replaced or cut); empty while it reads.
    QString error() const { return m_error; }
    /// One line that says where the reading stands ("following: 12,345 events, 3.2 MB").
    QString stateText() const;

    /// Milliseconds between two looks at a file that has not grown (default 500).
    void setPollInterval(int milliseconds) { m_pollMilliseconds = milliseconds; }
    int pollInterval() const { return m_pollMilliseconds; }
    /// Events handed to the GUI at most per delivery (default 20,000: a fraction of a second's work).
    void setMaxEventsPerDelivery(int events) { m_maxPerDelivery = events; }

Q_SIGNALS:
    /// A batch of the run's events, in file order.
    void eventsReceived(const QList<batchpilot::core::Event>& events);
    /// Something the user should know about the file: lines skipped, an incomplete last line, a
    /// read that failed (the reading then stops; error() says it).
    void problem(const QString& message);
    /// caughtUp(), runEnded(), the counts or error() changed.
    void stateChanged();

private:
    struct Shared;
    void deliver();
    void stopReader();

    std::shared_ptr<Shared> m_shared;
    std::thread m_reader;
    QTimer* m_timer;
    QString m_folder;
    QString m_error;
    bool m_caughtUp = false;
    bool m_ended = false;
    bool m_saidPending = false;
    bool m_silent = false;  ///< following, and the file has not grown for a minute
    qint64 m_bytesRead = 0;
    qint64 m_fileBytes = 0;
    qint64 m_events = 0;
    qint64 m_skippedLines = 0;
    qint64 m_pendingBytes = 0;
    int m_quietPolls = 0;
    int m_pollMilliseconds = 500;
    int m_maxPerDelivery = 20000;
};

}  // namespace batchpilot::ui
