#pragma once

// Serving a run over HTTP (batchpilot-cli --serve [ADDR:]PORT): the run's events as a stream of
// server-sent events, from its start for every client however late it connects, and the commands
// the window gives (pause, resume, stop, re-probe, target batch, device, memory savers, check
// equivalence). Loopback only unless asked otherwise; every request carries a token — a control
// token, or a watch token that can only read — generated from the OS's random source and written
// to the run folder readable by its owner only (serve.json). Reached from elsewhere through an SSH
// tunnel: ssh -L 8765:localhost:8765 gpu-server.
//
//   GET  /            {"events": N, "ended": bool, "access": "control"|"watch", "run_folder": …}
//   GET  /config      the run's configuration (a run configuration file's JSON, as config.json)
//   GET  /events      text/event-stream: "id: N" and "data: <events.jsonl line>" per event, N from
//                     1; resumes after the Last-Event-ID header (or ?from=N: from event N). Ends
//                     after the run's last event.
//   POST /command     {"command": "pause"} | "resume" | "stop" | "reprobe" |
//                     {"command": "target_batch", "target_batch": 2048, "lr_scaling": "linear"} |
//                     {"command": "device", "device": "cuda:1", "rank": 0} |
//                     {"command": "memory_savers", "memory_savers": "checkpoint"} |
//                     {"command": "check_equivalence", "samples": 0}
//
// Token: "Authorization: Bearer TOKEN" or "?token=TOKEN". Answers: 401 without the right token,
// 403 for a command with the watch token, 400 for a command that is not valid (the message is a
// configuration file's for the same value) or a position that is not one, 413 for a body over
// 64 KiB, 411 for a chunked body, 415 for a compressed one, 431 for more than 64 headers or
// 16 KiB of them, 429 past 100 requests a second from one address, 503 before the trainer exists
// or when the server's workers are all taken. What is checked before the token, and how
// connections are held, is app/request_gate.h's.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <tl/expected.hpp>

#include "app/request_gate.h"
#include "core/config/options.h"
#include "core/events/events.h"

namespace batchpilot::core {
class Trainer;
}

namespace batchpilot::app {

/// Where --serve listens.
struct ServeAddress {
    std::string host = "127.0.0.1";  ///< as given (shown in the URL)
    int port = 0;                    ///< 0: any free port (said in the URL)
    ListenAddress resolved;          ///< the address the host resolved to, checked
    bool loopback = true;            ///< whether it is a loopback address
};

/// "PORT" or "ADDR:PORT" ("[::1]:PORT" for IPv6), the host resolved once, here. An address other
/// than loopback (127.0.0.0/8, ::1) is refused unless `anyAddressAllowed` (--serve-any-address),
/// with a message that names the risk and the tunnel to use instead: a name is judged by the
/// address it resolves to, never by how it reads.
tl::expected<ServeAddress, std::string> parseServeAddress(const std::string& text, bool anyAddressAllowed);

/// A command for the run, read from a request's body and checked as the command line checks the
/// same values.
struct RemoteCommand {
    enum class Kind { Pause, Resume, Stop, Reprobe, TargetBatch, Device, MemorySavers, CheckEquivalence };
    Kind kind = Kind::Pause;
    int64_t targetBatch = 0;
    std::optional<core::LrScaling> lrScaling;
    std::string device;
    int rank = 0;
    core::MemorySavers savers = core::MemorySavers::Off;
    int64_t samples = 0;
};
/// The body's command; an error says what is wrong with it and what would be valid. The body is
/// at most a few KiB of JSON (the server refuses larger ones before this reads them).
tl::expected<RemoteCommand, std::string> parseRemoteCommand(const std::string& body);
/// The command in words, for the console ("target batch → 2048").
std::string describe(const RemoteCommand& command);

/// 128 bits from the OS's random source, as 32 hexadecimal digits.
std::string randomToken();
/// a == b in a time that does not depend on where they differ.
bool sameToken(const std::string& a, const std::string& b);

class RunServer final : public core::EventSink {
public:
    /// Listens on `address` and writes `runFolder`/serve.json (mode 0600: the URLs with their
    /// tokens). Fails with a message naming the address (in use, cannot be bound) or the file.
    static tl::expected<std::unique_ptr<RunServer>, std::string> start(const ServeAddress& address,
                                                                       const std::string& runFolder);
    ~RunServer() override;
    RunServer(const RunServer&) = delete;
    RunServer& operator=(const RunServer&) = delete;

    /// Called on the trainer's thread: the event joins the stream (spooled to a temporary file,
    /// so memory does not grow with the run).
    void onEvent(const core::Event& event) override;
    /// What GET /config answers: the run's configuration (core::toRunConfig's JSON).
    void setConfiguration(std::string json);
    /// Commands go to `trainer` from now on (503 before). `said` is told each command applied.
    void setTrainer(core::Trainer* trainer, std::function<void(const std::string&)> said = {});
    /// The run ended: streams end after its last event; commands are refused (409).
    void finish();
    /// After finish(): waits until every client has been sent the run's last event (or `limit`).
    void drain(std::chrono::milliseconds limit);

    /// http://HOST:PORT/?token=CONTROL, and the same with the watch token.
    std::string url() const;
    std::string watchUrl() const;
    int port() const;
    const std::string& servePath() const;

private:
    struct Impl;
    explicit RunServer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

}  // namespace batchpilot::app
