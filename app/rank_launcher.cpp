#include "app/rank_launcher.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/base/host_memory.h"
#include "core/config/device_spec.h"
#include "core/config/options.h"
#include "core/device/math_libraries.h"
#include "core/distributed/process_group.h"

extern char** environ;

namespace batchpilot::app {

namespace {

/// How long the other ranks have to end by themselves after one failed.
constexpr std::chrono::seconds kStopGrace{10};

std::atomic<int> g_launcherSignal{0};
std::atomic<int> g_launcherSignals{0};

void onLauncherSignal(int number) {
    g_launcherSignal.store(number);
    g_launcherSignals.fetch_add(1);
}

/// What one rank process holds before its data and model: LibTorch, its threads and the CLI
/// (measured: 64 ranks of a small MLP took 11.5 GB, 180 MiB each).
constexpr int64_t kRankHostBytes = int64_t{180} << 20;

/// Ranks that train on the host's cores (the cpu and virtual devices: a virtual GPU computes on
/// the host) per core, at most: beyond, they take turns on the cores, and every step waits for the
/// slowest (64 ranks on 2 cores started and crawled, each at 1/32 of its speed alone).
constexpr int64_t kHostRanksPerCore = 4;

/// The ranks among `devices` that compute on the host (not a CUDA device).
int64_t hostRanks(const std::vector<std::string>& devices) {
    return std::count_if(devices.begin(), devices.end(), [](const std::string& device) {
        const auto spec = core::parseDeviceName(device);
        return !spec || spec->kind != core::DeviceKind::Cuda;
    });
}

std::string gib(int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / double(int64_t{1} << 30));
    return text;
}

struct Worker {
    int rank = 0;
    std::string device;
    pid_t pid = -1;
    bool running = false;
    int status = 0;  ///< waitpid's, once it ended
};

std::string describeEnd(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
        const int number = WTERMSIG(status);
        const char* name = ::strsignal(number);
        return "was killed by signal " + std::to_string(number) +
               (name != nullptr ? std::string(" (") + name + ")" : "");
    }
    return "ended (status " + std::to_string(status) + ")";
}

/// The exit status the launcher reports for a rank that ended with `status`.
int exitStatusOf(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

/// Starts rank `worker.rank`: this program, with --device and torchrun's variables. It gets a
/// process group of its own, so that Ctrl-C in the terminal reaches the launcher only, which
/// passes it on once to every rank (each then stops at the same batch).
std::optional<std::string> spawn(Worker& worker, const LaunchOptions& options, int port) {
    std::vector<std::string> arguments{"batchpilot-cli"};
    arguments.insert(arguments.end(), options.arguments.begin(), options.arguments.end());
    arguments.push_back("--device");
    arguments.push_back(worker.device);
    const auto variables = core::localRankVariables(worker.rank, static_cast<int>(options.devices.size()), port,
                                                    static_cast<long>(::getpid()));
    std::vector<std::string> environment;
    for (char** variable = environ; *variable != nullptr; ++variable) {
        const std::string entry = *variable;
        const std::string name = entry.substr(0, entry.find('='));
        const bool replaced =
            std::any_of(variables.begin(), variables.end(), [&name](const auto& v) { return v.first == name; });
        if (!replaced) environment.push_back(entry);
    }
    for (const auto& [name, value] : variables) environment.push_back(name + "=" + value);

    std::vector<char*> argv;
    for (auto& a : arguments) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : environment) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // Rank 0 prints the job's progress (every rank's numbers reach it each step); the others
    // would repeat it. Their errors still reach the terminal.
    if (worker.rank > 0) posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attributes, 0);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    posix_spawnattr_setsigdefault(&attributes, &defaults);
    const int failed = ::posix_spawn(&worker.pid, "/proc/self/exe", &actions, &attributes, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    if (failed != 0)
        return std::string("could not start rank ") + std::to_string(worker.rank) + ": " + std::strerror(failed);
    worker.running = true;
    return std::nullopt;
}

}  // namespace

std::vector<std::string> withoutDevicesFlag(const std::vector<std::string>& arguments) {
    std::vector<std::string> kept;
    for (size_t i = 0; i < arguments.size(); ++i) {
        if (arguments[i] == "--devices") {
            ++i;  // and its value
            continue;
        }
        if (arguments[i].rfind("--devices=", 0) == 0) continue;
        kept.push_back(arguments[i]);
    }
    return kept;
}

int launchRanks(const LaunchOptions& options) {
    // Each rank is a process of its own: refused before any starts when together they would
    // hold more host memory than the machine has free (64 ranks took 11.5 GB without a word).
    const auto ranks = static_cast<int64_t>(options.devices.size());
    if (ranks > core::kMaxDevices) {
        std::fprintf(stderr, "batchpilot-cli: --devices: %lld devices given, at most %d: one process each\n",
                     static_cast<long long>(ranks), core::kMaxDevices);
        return 2;
    }
    if (const std::optional<int64_t> available =
            core::hostAvailableBytes() > 0 ? std::optional<int64_t>(core::hostAvailableBytes()) : std::nullopt;
        available && ranks * kRankHostBytes > *available) {
        std::fprintf(stderr,
                     "batchpilot-cli: --devices: %lld ranks, one process each, take at least %s of host memory "
                     "(about 180 MiB a rank before its data and model), and %s is available: give fewer devices\n",
                     static_cast<long long>(ranks), gib(ranks * kRankHostBytes).c_str(), gib(*available).c_str());
        return 2;
    }
    // Ranks on the host's cores share them: refused where each would get less than a quarter of
    // a core, and the cost said where they share at all.
    const int64_t onHost = hostRanks(options.devices);
    const auto cores = static_cast<int64_t>(core::cpusAvailable());
    const auto cpus = [](int64_t n) { return std::to_string(n) + (n == 1 ? " CPU" : " CPUs"); };
    if (cores > 0 && onHost > kHostRanksPerCore * cores) {
        std::fprintf(stderr,
                     "batchpilot-cli: --devices: %lld ranks train on the %s this process may use (cpu and virtual "
                     "devices compute on the host), at most %lld (%lld a CPU): with more, each rank computes at "
                     "about 1/%lld of its speed alone and every step waits for the slowest: give fewer devices\n",
                     static_cast<long long>(onHost), cpus(cores).c_str(),
                     static_cast<long long>(kHostRanksPerCore * cores), static_cast<long long>(kHostRanksPerCore),
                     static_cast<long long>((onHost + cores - 1) / cores));
        return 2;
    }
    auto store = core::StoreHost::start();
    if (!store) {
        std::fprintf(stderr, "batchpilot-cli: %s\n", store.error().c_str());
        return 1;
    }
    std::signal(SIGINT, onLauncherSignal);
    std::signal(SIGTERM, onLauncherSignal);
    std::vector<Worker> workers;
    for (size_t r = 0; r < options.devices.size(); ++r) workers.push_back({static_cast<int>(r), options.devices[r]});
    std::printf("several devices: %zu ranks, one process each (", workers.size());
    for (const Worker& w : workers) std::printf("%srank %d %s", w.rank > 0 ? ", " : "", w.rank, w.device.c_str());
    std::printf("); rank 0 reports; at least %s of host memory in all", gib(ranks * kRankHostBytes).c_str());
    if (cores > 0 && onHost > cores) {
        std::printf("; %lld ranks share %s: each computes at about 1/%lld of its speed alone",
                    static_cast<long long>(onHost), cpus(cores).c_str(),
                    static_cast<long long>((onHost + cores - 1) / cores));
    }
    std::printf("\n");
    std::fflush(stdout);
    for (Worker& w : workers) {
        if (auto error = spawn(w, options, (*store)->port())) {
            std::fprintf(stderr, "batchpilot-cli: %s\n", error->c_str());
            for (Worker& started : workers)
                if (started.running) ::kill(started.pid, SIGKILL);
            for (Worker& started : workers)
                if (started.running) ::waitpid(started.pid, nullptr, 0);
            return 1;
        }
    }
    using Clock = std::chrono::steady_clock;
    bool stopping = false;  // a rank failed: the others have until `deadline` to end
    Clock::time_point deadline{};
    std::optional<int> firstFailure;  // its exit status
    int forwarded = 0;                // signals passed on to the ranks
    size_t running = workers.size();
    while (running > 0) {
        // A signal to the launcher goes to every rank, once per signal: the first stops them
        // after the current batch, a second ends them at once (as for a single process).
        for (const int received = g_launcherSignals.load(); forwarded < received; ++forwarded) {
            for (const Worker& w : workers)
                if (w.running) ::kill(w.pid, SIGINT);
        }
        int status = 0;
        const pid_t ended = ::waitpid(-1, &status, WNOHANG);
        if (ended > 0) {
            for (Worker& w : workers) {
                if (w.pid != ended || !w.running) continue;
                w.running = false;
                w.status = status;
                --running;
                const bool success = WIFEXITED(status) && WEXITSTATUS(status) == 0;
                const bool stoppedBySignal = g_launcherSignal.load() != 0;
                if (!success && !firstFailure && !(stoppedBySignal && exitStatusOf(status) >= 128)) {
                    firstFailure = exitStatusOf(status);
                    // The job cannot go on without it: the others get a moment to notice and say
                    // so (a rank's collective fails at once when a peer's connection closes), then
                    // they are ended. The last checkpoint is whole either way (written atomically).
                    stopping = true;
                    deadline = Clock::now() + std::min<std::chrono::seconds>(options.rankTimeout, kStopGrace);
                    if (running > 0) {
                        std::fprintf(stderr, "batchpilot-cli: rank %d (%s) %s; stopping the other ranks\n", w.rank,
                                     w.device.c_str(), describeEnd(status).c_str());
                    } else {
                        std::fprintf(stderr, "batchpilot-cli: rank %d (%s) %s\n", w.rank, w.device.c_str(),
                                     describeEnd(status).c_str());
                    }
                }
            }
            continue;
        }
        if (stopping && Clock::now() > deadline) {
            for (Worker& w : workers) {
                if (!w.running) continue;
                std::fprintf(stderr, "batchpilot-cli: rank %d (%s) is still running without it: ending it\n", w.rank,
                             w.device.c_str());
                ::kill(w.pid, SIGKILL);
            }
            stopping = false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (firstFailure) return *firstFailure;
    // Stopped by a signal: the ranks' own status says it (128+N), rank 0's first.
    for (const Worker& w : workers)
        if (exitStatusOf(w.status) != 0) return exitStatusOf(w.status);
    return 0;
}

}  // namespace batchpilot::app
