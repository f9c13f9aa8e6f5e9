#pragma once

#include <QByteArray>
#include <QList>
#include <QObject>
#include <QString>
#include <QUrl>

#include "core/events/event_stream.h"
#include "core/events/events.h"
#include "core/config/options.h"
#include "ui/session/event_metatypes.h"

class QNetworkAccessManager;
class QNetworkReply;
class QNetworkRequest;
class QTimer;

namespace batchpilot::ui {

/// A run served by `batchpilot-cli --serve` (app/run_server.h), shown and steered from this
/// window: its events from the run's start, in order, to the same views a run of this window's
/// fills, and the run panel's commands sent to it. A cut connection is reconnected by itself
/// (after 1, 2, 4… up to 10 s) from the last event received, so no event is lost or repeated.
///
/// Thread rules: GUI thread only (QNetworkAccessManager).
class RemoteRun : public QObject {
    Q_OBJECT
public:
    enum class State { Closed, Connecting, Live, Reconnecting, Ended, Failed };

    explicit RemoteRun(QObject* parent = nullptr);
    ~RemoteRun() override;

    /// Why `url` cannot be a served run's ("http://HOST:PORT/?token=…"), empty when it can.
    static QString whyNotARunUrl(const QUrl& url);
    /// Connects to the run at `url`; false with `error` when the URL is not one.
    bool connectTo(const QUrl& url, QString* error = nullptr);
    void close();
    bool isOpen() const { return m_state != State::Closed; }
    State state() const { return m_state; }
    /// The URL without its token, to show.
    QString address() const;
    /// The token steers the run (the control token), not only watches it; known once connected.
    bool canControl() const { return m_control; }
    bool runEnded() const { return m_ended; }
    qint64 events() const { return m_reader.lastId(); }
    /// One line on the connection ("live, 1,234 events", "reconnecting in 2 s (attempt 3)…").
    QString stateText() const;

    // Commands, sent to the run (with the control token): the server checks them and the run
    // applies them at its next training batch; a refusal comes back as problem().
    void pause();
    void resume();
    void stop();
    void reprobe();
    void setTargetBatch(qint64 target, core::LrScaling rule);
    void switchDevice(const QString& device, int rank);
    void setMemorySavers(core::MemorySavers savers);
    void checkEquivalence(qint64 samples);

    /// Tests: cuts the event stream as a network would (the reconnection follows).
    void dropConnection();

Q_SIGNALS:
    void eventsReceived(const QList<batchpilot::core::Event>& events);
    /// Something the user should know (a refused command, a skipped line, a refused token).
    void problem(const QString& message);
    void stateChanged();
    /// The run's configuration (GET /config: a run configuration's JSON), once connected.
    void configurationReceived(const QByteArray& json);

private:
    void openStream();
    /// Holds the answer `reply` to `maxBytes` of plain (not compressed) bytes: past them, or when
    /// its headers announce more, it is cut off and problem() says that `what` is refused. A
    /// served run's answers are a few KiB; a server that sends gigabytes is not one.
    void bound(QNetworkReply* reply, qint64 maxBytes, const QString& what);
    void readStream(bool all = false);
    void streamEnded();
    void deliver();
    void send(const QByteArray& json, const QString& what);
    void setState(State state);
    /// A request for `path` on the server, carrying the token.
    QNetworkRequest authorized(const QString& path) const;

    QNetworkAccessManager* m_network;
    QNetworkReply* m_stream = nullptr;
    QTimer* m_deliver;
    QTimer* m_retry;
    QUrl m_base;
    QString m_token;
    State m_state = State::Closed;
    bool m_control = false;
    bool m_ended = false;
    int m_attempts = 0;
    core::EventStreamReader m_reader;  ///< the stream's bytes not read yet: at most one record's
    QList<core::Event> m_pending;
};

}  // namespace batchpilot::ui
