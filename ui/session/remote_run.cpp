#include "ui/session/remote_run.h"

#include <algorithm>

#include <QJsonDocument>
#include <QJsonObject>
#include <QLocale>
#include <QNetworkAccessManager>
#include <QNetworkReply>
#include <QNetworkRequest>
#include <QTimer>
#include <QUrlQuery>

#include "core/config/run_config.h"
#include "core/events/event_json.h"

namespace batchpilot::ui {
namespace {

constexpr int kMaxPending = 100000;      ///< events waiting for the GUI; the stream waits beyond
constexpr int kMaxPerDelivery = 20000;   ///< events handed to the views at once
constexpr qint64 kReadBuffer = 4 << 20;  ///< bytes Qt keeps unread before TCP holds the server back
constexpr int kParsePerRead = 4000;      ///< events parsed per read on the GUI thread
/// The server's answers besides the stream and the configuration (GET /, a command's): a few
/// hundred bytes; the server takes no more in a request's body either.
constexpr qint64 kMaxAnswerBytes = 64 << 10;

}  // namespace

RemoteRun::RemoteRun(QObject* parent)
    : QObject(parent),
      m_network(new QNetworkAccessManager(this)),
      m_deliver(new QTimer(this)),
      m_retry(new QTimer(this)) {
    m_deliver->setInterval(33);
    connect(m_deliver, &QTimer::timeout, this, &RemoteRun::deliver);
    m_retry->setSingleShot(true);
    connect(m_retry, &QTimer::timeout, this, &RemoteRun::openStream);
}

RemoteRun::~RemoteRun() {
    // Destroyed as its parent window's child: the window's slots must not run on a half-destroyed
    // window (UBSan's finding), so the closing says nothing.
    blockSignals(true);
    close();
}

QString RemoteRun::whyNotARunUrl(const QUrl& url) {
    if (!url.isValid() || url.scheme() != QLatin1String("http") || url.host().isEmpty() || url.port() <= 0)
        return tr("\"%1\" is not a served run's address: give the URL batchpilot-cli --serve printed, "
                  "http://HOST:PORT/?token=…")
            .arg(url.toString(QUrl::RemoveQuery));
    if (!QUrlQuery(url).hasQueryItem(QStringLiteral("token")))
        return tr(
            "the URL has no token: give the whole URL batchpilot-cli --serve printed (…/?token=…), which is "
            "also in the run folder's serve.json");
    return {};
}

bool RemoteRun::connectTo(const QUrl& url, QString* error) {
    close();
    if (const QString why = whyNotARunUrl(url); !why.isEmpty()) {
        if (error) *error = why;
        return false;
    }
    m_token = QUrlQuery(url).queryItemValue(QStringLiteral("token"));
    m_base = url.adjusted(QUrl::RemoveQuery | QUrl::RemovePath | QUrl::RemoveFragment);
    m_control = m_ended = false;
    m_attempts = 0;
    m_reader = core::EventStreamReader();
    m_pending.clear();
    setState(State::Connecting);
    // Which token it is: a watch token cannot steer (the controls stay off).
    QNetworkReply* access = m_network->get(authorized(QStringLiteral("/")));
    bound(access, kMaxAnswerBytes, tr("the run's answer on access"));
    connect(access, &QNetworkReply::finished, this, [this, access] {
        access->deleteLater();
        if (m_state == State::Closed || access->error() != QNetworkReply::NoError) return;
        const int status = access->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
        if (status == 200) {
            m_control = QJsonDocument::fromJson(access->readAll()).object().value(QStringLiteral("access")) ==
                        QLatin1String("control");
            Q_EMIT stateChanged();
        }
    });
    QNetworkReply* config = m_network->get(authorized(QStringLiteral("/config")));
    bound(config, static_cast<qint64>(core::kMaxRunConfigBytes), tr("the run's configuration"));
    connect(config, &QNetworkReply::finished, this, [this, config] {
        config->deleteLater();
        if (m_state == State::Closed || config->error() != QNetworkReply::NoError) return;
        if (config->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt() == 200)
            Q_EMIT configurationReceived(config->readAll());
    });
    openStream();
    m_deliver->start();
    return true;
}

void RemoteRun::close() {
    m_retry->stop();
    m_deliver->stop();
    if (m_stream) {
        QNetworkReply* stream = m_stream;
        m_stream = nullptr;
        stream->disconnect(this);
        stream->abort();
        stream->deleteLater();
    }
    if (m_state != State::Closed) setState(State::Closed);
}

QString RemoteRun::address() const {
    return m_base.toString();
}

QNetworkRequest RemoteRun::authorized(const QString& path) const {
    QUrl url = m_base;
    url.setPath(path);
    QNetworkRequest request(url);
    request.setRawHeader("Authorization", "Bearer " + m_token.toUtf8());
    // Asked for plainly, Qt inflates nothing: a compressed answer is refused (bound()), never
    // inflated into gigabytes from a few hundred KiB.
    request.setRawHeader("Accept-Encoding", "identity");
    return request;
}

void RemoteRun::bound(QNetworkReply* reply, qint64 maxBytes, const QString& what) {
    // Qt reads no more than this ahead of readAll(), whatever the server sends. The margin: Qt
    // may stop reading a little short of its buffer's size, and a buffer that stops at maxBytes or
    // below would wait for ever without the "goes on past" check below ever seeing more.
    reply->setReadBufferSize(maxBytes + (256 << 10));
    const auto check = [this, reply, maxBytes, what] {
        if (!reply->isRunning()) return;
        const QByteArray encoding = reply->rawHeader("Content-Encoding").trimmed().toLower();
        const QVariant length = reply->header(QNetworkRequest::ContentLengthHeader);
        QString why;
        if (!encoding.isEmpty() && encoding != "identity")
            why = tr("it comes compressed (%1), which this window does not inflate").arg(QString::fromLatin1(encoding));
        else if (length.isValid() && length.toLongLong() > maxBytes)
            why = tr("it claims %1 bytes").arg(length.toLongLong());
        else if (reply->bytesAvailable() > maxBytes)
            why = tr("it goes on past %1 bytes").arg(maxBytes);
        if (why.isEmpty()) return;
        reply->abort();
        Q_EMIT problem(tr("%1 is refused: %2 (a served run's is at most %3 bytes; is %4 a BatchPilot run?)")
                           .arg(what, why)
                           .arg(maxBytes)
                           .arg(address()));
    };
    connect(reply, &QNetworkReply::metaDataChanged, this, check);
    connect(reply, &QNetworkReply::readyRead, this, check);
}

void RemoteRun::openStream() {
    QNetworkRequest request = authorized(QStringLiteral("/events"));
    request.setRawHeader("Accept", "text/event-stream");
    // From the event after the last one received: none lost, none repeated.
    if (m_reader.lastId() > 0) request.setRawHeader("Last-Event-ID", QByteArray::number(m_reader.lastId()));
    request.setAttribute(QNetworkRequest::CacheLoadControlAttribute, QNetworkRequest::AlwaysNetwork);
    request.setTransferTimeout(0);
    m_reader.restart();
    m_stream = m_network->get(request);
    m_stream->setReadBufferSize(kReadBuffer);
    connect(m_stream, &QNetworkReply::readyRead, this, [this] { readStream(); });
    connect(m_stream, &QNetworkReply::finished, this, &RemoteRun::streamEnded);
    connect(m_stream, &QNetworkReply::metaDataChanged, this, [this] {
        if (m_stream && m_stream->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt() == 200) {
            m_attempts = 0;
            setState(State::Live);
        }
    });
}

void RemoteRun::readStream(bool all) {
    if (!m_stream) return;
    // Parsed on the GUI thread, so a few thousand events at a time (~10 ms), the rest at the next
    // delivery; beyond kMaxPending waiting events the rest stays in the socket, and TCP holds the
    // server back. `all`: the stream has ended, and what it sent is read now or never.
    int parsed = 0;
    while (all || (m_pending.size() < kMaxPending && parsed < kParsePerRead)) {
        std::optional<core::StreamRecord> record = m_reader.next();
        if (!record) {
            if (m_stream->bytesAvailable() <= 0) break;
            const QByteArray bytes = m_stream->read(1 << 20);
            m_reader.append(std::string_view(bytes.constData(), static_cast<size_t>(bytes.size())));
            continue;
        }
        ++parsed;
        if (!record->event) {
            Q_EMIT problem(tr("event %1: %2: skipped")
                               .arg(record->id > 0 ? record->id : m_reader.lastId() + 1)
                               .arg(QString::fromStdString(record->event.error())));
            continue;
        }
        if (const auto* state = std::get_if<core::RunStateChanged>(&*record->event))
            m_ended = state->state == core::RunState::Finished || state->state == core::RunState::Failed;
        m_pending.append(std::move(*record->event));
    }
}

void RemoteRun::deliver() {
    readStream();
    if (m_pending.isEmpty()) return;
    const qsizetype count = std::min<qsizetype>(m_pending.size(), kMaxPerDelivery);
    QList<core::Event> batch = m_pending.mid(0, count);
    m_pending.remove(0, count);
    Q_EMIT eventsReceived(batch);
    if (m_ended && m_pending.isEmpty() && m_state != State::Ended && !m_stream) setState(State::Ended);
    Q_EMIT stateChanged();
}

void RemoteRun::streamEnded() {
    QNetworkReply* stream = m_stream;
    if (!stream) return;
    readStream(/*all=*/true);
    m_stream = nullptr;
    const int status = stream->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
    const QByteArray body = status >= 400 ? stream->readAll() : QByteArray();
    stream->deleteLater();
    if (m_ended) {
        setState(State::Ended);
        return;
    }
    if (status == 401 || status == 400) {
        const QString why = QJsonDocument::fromJson(body).object().value(QStringLiteral("error")).toString();
        Q_EMIT problem(tr("the run at %1 refused the connection: %2").arg(address(), why));
        setState(State::Failed);
        return;
    }
    // Cut (network, a server restarting): again from the last event received.
    ++m_attempts;
    setState(State::Reconnecting);
    m_retry->start(std::min(10'000, 1000 << std::min(m_attempts - 1, 4)));
}

void RemoteRun::dropConnection() {
    if (m_stream) m_stream->abort();
}

void RemoteRun::send(const QByteArray& json, const QString& what) {
    QNetworkRequest request = authorized(QStringLiteral("/command"));
    request.setHeader(QNetworkRequest::ContentTypeHeader, QStringLiteral("application/json"));
    QNetworkReply* reply = m_network->post(request, json);
    bound(reply, kMaxAnswerBytes, tr("the answer to %1").arg(what));
    connect(reply, &QNetworkReply::finished, this, [this, reply, what] {
        reply->deleteLater();
        const int status = reply->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
        if (status == 200 || reply->error() == QNetworkReply::OperationCanceledError) return;
        const QString why =
            QJsonDocument::fromJson(reply->readAll()).object().value(QStringLiteral("error")).toString();
        Q_EMIT problem(tr("%1 was not applied: %2").arg(what, why.isEmpty() ? reply->errorString() : why));
    });
}

void RemoteRun::pause() {
    send(R"({"command":"pause"})", tr("pause"));
}
void RemoteRun::resume() {
    send(R"({"command":"resume"})", tr("resume"));
}
void RemoteRun::stop() {
    send(R"({"command":"stop"})", tr("stop"));
}
void RemoteRun::reprobe() {
    send(R"({"command":"reprobe"})", tr("re-probe"));
}
void RemoteRun::setTargetBatch(qint64 target, core::LrScaling rule) {
    const QJsonObject body{{QStringLiteral("command"), QStringLiteral("target_batch")},
                           {QStringLiteral("target_batch"), target},
                           {QStringLiteral("lr_scaling"), QString::fromLatin1(core::toString(rule))}};
    send(QJsonDocument(body).toJson(QJsonDocument::Compact), tr("target batch %1").arg(target));
}
void RemoteRun::switchDevice(const QString& device, int rank) {
    const QJsonObject body{{QStringLiteral("command"), QStringLiteral("device")},
                           {QStringLiteral("device"), device},
                           {QStringLiteral("rank"), rank}};
    send(QJsonDocument(body).toJson(QJsonDocument::Compact), tr("device %1").arg(device));
}
void RemoteRun::setMemorySavers(core::MemorySavers savers) {
    const QJsonObject body{{QStringLiteral("command"), QStringLiteral("memory_savers")},
                           {QStringLiteral("memory_savers"), QString::fromLatin1(core::toString(savers))}};
    send(QJsonDocument(body).toJson(QJsonDocument::Compact), tr("memory savers"));
}
void RemoteRun::checkEquivalence(qint64 samples) {
    const QJsonObject body{{QStringLiteral("command"), QStringLiteral("check_equivalence")},
                           {QStringLiteral("samples"), samples}};
    send(QJsonDocument(body).toJson(QJsonDocument::Compact), tr("check equivalence"));
}

void RemoteRun::setState(State state) {
    if (state == m_state) return;
    m_state = state;
    Q_EMIT stateChanged();
}

QString RemoteRun::stateText() const {
    const QString events = QLocale().toString(m_reader.lastId());
    switch (m_state) {
    case State::Closed: return {};
    case State::Connecting: return tr("%1: connecting…").arg(address());
    case State::Live: return tr("%1: live (%2 events)").arg(address(), events);
    case State::Reconnecting:
        return tr("%1: connection lost, reconnecting (attempt %2, from event %3)…")
            .arg(address())
            .arg(m_attempts)
            .arg(m_reader.lastId() + 1);
    case State::Ended: return tr("%1: the run ended (%2 events)").arg(address(), events);
    case State::Failed: return tr("%1: refused").arg(address());
    }
    return {};
}

}  // namespace batchpilot::ui
