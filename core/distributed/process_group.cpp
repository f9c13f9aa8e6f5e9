#include "core/distributed/process_group.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <torch/torch.h>

// BATCHPILOT_HAVE_GLOO: CMake found Gloo's headers (libgloo-dev; PyPI's torch does not ship
// them). Without them this build trains on one device and says so when asked for more.
#if BATCHPILOT_HAVE_GLOO
// Gloo's process group is declared only with USE_C10D_GLOO (LibTorch's own build defines it).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif
// BATCHPILOT_HAVE_NCCL: a CUDA LibTorch whose NCCL process group (in libtorch_cuda, declared with
// USE_C10D_NCCL) and nccl.h (PyPI's nvidia-nccl wheel) CMake found.
#if BATCHPILOT_HAVE_GLOO && BATCHPILOT_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <net/if.h>
#include <unistd.h>

#include "core/device/counting_allocator.h"
#include "core/plan/rank_shares.h"

namespace batchpilot::core {

namespace {

constexpr int kMaxWorldSize = 4096;
/// Between two heartbeats of a rank (ProcessGroupLink::unresponsiveRanks).
constexpr std::chrono::milliseconds kBeat{500};
constexpr const char* kKeyPrefix = "batchpilot/";

/// A whole decimal number in [low, high] from the environment variable `name`.
tl::expected<std::optional<long>, std::string> integerVariable(const char* name, long low, long high) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return std::optional<long>{};
    errno = 0;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < low || value > high) {
        return tl::make_unexpected(std::string("the environment variable ") + name + "=\"" + text +
                                   "\" is not a whole number from " + std::to_string(low) + " to " +
                                   std::to_string(high));
    }
    return std::optional<long>{value};
}

/// BATCHPILOT_COLLECTIVES: "gloo", "nccl" (in any case), or empty (NCCL where it fits); anything
/// else is refused by ProcessGroupLink::collectivesProblem before a job starts.
std::string collectivesAsked() {
    const char* asked = std::getenv("BATCHPILOT_COLLECTIVES");
    std::string text = asked == nullptr ? std::string() : std::string(asked);
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
    return text;
}

/// GLOO_SOCKET_IFNAME's interface names (none when unset or empty).
std::vector<std::string> glooInterfaces() {
    std::vector<std::string> names;
    const char* text = std::getenv("GLOO_SOCKET_IFNAME");
    if (text == nullptr) return names;
    std::string rest = text;
    for (size_t start = 0; start <= rest.size();) {
        const size_t comma = std::min(rest.find(',', start), rest.size());
        if (comma > start) names.push_back(rest.substr(start, comma - start));
        start = comma + 1;
    }
    return names;
}

#if BATCHPILOT_HAVE_GLOO
bool isLoopback(const std::string& address) {
    return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

/// The network devices Gloo's connections use: GLOO_SOCKET_IFNAME's interfaces where set (as in
/// PyTorch), the loopback for a job on one machine, otherwise the interface of this host's name.
std::vector<std::shared_ptr<::gloo::transport::Device>> glooDevices(const std::string& masterAddress) {
    if (const std::vector<std::string> names = glooInterfaces(); !names.empty()) {
        std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
        for (const std::string& name : names) devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
        return devices;
    }
    if (isLoopback(masterAddress)) return {c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")};
    return {c10d::ProcessGroupGloo::createDefaultDevice()};
}
#endif

std::string firstMessageLine(const std::string& text) {
    const auto end = text.find('\n');
    return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace

tl::expected<std::optional<RankEnvironment>, std::string> rankEnvironment() {
    auto world = integerVariable("WORLD_SIZE", 1, kMaxWorldSize);
    if (!world) return tl::make_unexpected(world.error());
    auto rank = integerVariable("RANK", 0, kMaxWorldSize - 1);
    if (!rank) return tl::make_unexpected(rank.error());
    if (!*world) {
        if (*rank) return tl::make_unexpected(std::string("RANK is set but WORLD_SIZE is not: set both, or neither"));
        return std::optional<RankEnvironment>{};
    }
    if (**world == 1) return std::optional<RankEnvironment>{};
    if (!*rank) {
        return tl::make_unexpected("WORLD_SIZE=" + std::to_string(**world) +
                                   " is set but RANK is not: each process of a job needs its RANK (0 to " +
                                   std::to_string(**world - 1) + ")");
    }
    if (**rank >= **world) {
        return tl::make_unexpected("RANK=" + std::to_string(**rank) +
                                   " is not below WORLD_SIZE=" + std::to_string(**world) + ": ranks count from 0");
    }
    RankEnvironment where;
    where.rank = static_cast<int>(**rank);
    where.worldSize = static_cast<int>(**world);
    auto local = integerVariable("LOCAL_RANK", 0, kMaxWorldSize - 1);
    if (!local) return tl::make_unexpected(local.error());
    where.localRank = local->has_value() ? static_cast<int>(**local) : where.rank;
    auto localWorld = integerVariable("LOCAL_WORLD_SIZE", 1, **world);
    if (!localWorld) return tl::make_unexpected(localWorld.error());
    where.localWorldSize = localWorld->has_value() ? static_cast<int>(**localWorld) : 0;
    const char* address = std::getenv("MASTER_ADDR");
    if (address == nullptr || *address == '\0') {
        return tl::make_unexpected(std::string(
            "WORLD_SIZE is set but MASTER_ADDR is not: name the host of rank 0 (or of the launcher's store), "
            "e.g. MASTER_ADDR=127.0.0.1 on one machine"));
    }
    where.masterAddress = address;
    auto port = integerVariable("MASTER_PORT", 1, 65535);
    if (!port) return tl::make_unexpected(port.error());
    if (!*port) {
        return tl::make_unexpected(std::string(
            "WORLD_SIZE is set but MASTER_PORT is not: name a free TCP port on MASTER_ADDR, e.g. MASTER_PORT=29500"));
    }
    where.masterPort = static_cast<int>(**port);
    if (const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE"); agent != nullptr) {
        where.agentStore = std::string(agent) == "True" || std::string(agent) == "true" || std::string(agent) == "1";
    }
    return std::optional<RankEnvironment>{where};
}

#if BATCHPILOT_HAVE_GLOO

struct ProcessGroupLink::Impl {
    RankEnvironment where;
    std::chrono::milliseconds timeout{0};
    c10::intrusive_ptr<c10d::Store> store;  ///< prefixed with kKeyPrefix
    c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
    c10::intrusive_ptr<c10d::Store> tcp;  ///< the job's store, unprefixed (each group prefixes its own keys)
#if BATCHPILOT_HAVE_NCCL
    c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;  ///< sums CUDA tensors when set (useNccl)
#endif
    int ncclGroups = 0;  ///< NCCL communicators made so far: names each one's keys
    // The heartbeat: "alive/<rank>" counts up every kBeat while this process runs.
    std::mutex beatMutex;
    std::condition_variable beatWake;
    bool beatDone = false;
    std::thread beat;

    /// Rank `r`'s heartbeat count so far (-1: it has not beaten yet).
    int64_t beats(int r) {
        const std::string key = "alive/" + std::to_string(r);
        return store->check({key}) ? store->add(key, 0) : -1;
    }

    void startBeating() {
        beat = std::thread([this] {
            std::unique_lock lock(beatMutex);
            const std::string key = "alive/" + std::to_string(where.rank);
            while (!beatDone) {
                try {
                    store->add(key, 1);
                } catch (const std::exception&) {
                    return;  // the store is gone: nobody is left to read the beat
                }
                beatWake.wait_for(lock, kBeat);
            }
        });
    }
    ~Impl() {
        {
            std::lock_guard lock(beatMutex);
            beatDone = true;
        }
        beatWake.notify_all();
        if (beat.joinable()) beat.join();
    }
};

tl::expected<void, std::string> ProcessGroupLink::connect() {
    Impl& impl = *m_impl;
    if (impl.group) return {};
    if (std::string problem = glooInterfaceProblem(); !problem.empty()) return tl::make_unexpected(std::move(problem));
    const RankEnvironment& where = impl.where;
    try {
        c10d::TCPStoreOptions storeOptions;
        storeOptions.port = static_cast<std::uint16_t>(where.masterPort);
        storeOptions.isServer = where.rank == 0 && !where.agentStore;
        storeOptions.numWorkers = static_cast<std::size_t>(where.worldSize);
        storeOptions.waitWorkers = false;  // the process group's rendezvous waits for them
        storeOptions.timeout = impl.timeout;
        auto tcp = c10::make_intrusive<c10d::TCPStore>(where.masterAddress, storeOptions);
        impl.tcp = tcp;
        impl.store = c10::make_intrusive<c10d::PrefixStore>(kKeyPrefix, tcp);
        // Every rank counts itself in, and none sets up Gloo's connections before all have: Gloo
        // prepares a connection to every other rank first, which for WORLD_SIZE=4096 took 44 s
        // before a 2 s timeout was even looked at. The count makes the timeout the timeout, and
        // says how many ranks came.
        impl.store->add("joined", 1);
        const auto deadline = std::chrono::steady_clock::now() + impl.timeout;
        for (int64_t joined = 0;;) {
            joined = impl.store->add("joined", 0);
            if (joined >= where.worldSize) break;
            if (std::chrono::steady_clock::now() >= deadline)
                throw std::runtime_error(std::to_string(joined) + " of " + std::to_string(where.worldSize) +
                                         " ranks joined");
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        auto options = c10d::ProcessGroupGloo::Options::create(impl.timeout);
        options->devices = glooDevices(where.masterAddress);
        options->threads = 2;
        auto groupStore = c10::make_intrusive<c10d::PrefixStore>("gloo", tcp);
        impl.group = c10::make_intrusive<c10d::ProcessGroupGloo>(groupStore, where.rank, where.worldSize, options);
        impl.startBeating();
    } catch (const std::exception& e) {
        impl.group.reset();
        return tl::make_unexpected("rank " + std::to_string(where.rank) + " of " + std::to_string(where.worldSize) +
                                   " could not join the job at " + where.masterAddress + ":" +
                                   std::to_string(where.masterPort) + " within " +
                                   std::to_string(impl.timeout.count() / 1000) + " s: " + firstMessageLine(e.what()) +
                                   "; check MASTER_ADDR and MASTER_PORT, and that every rank was started");
    }
    return {};
}

void ProcessGroupLink::allReduceSum(std::vector<at::Tensor>& tensors) {
    CountingScope uncounted(false);  // the exchange's own buffers are bookkeeping, not training's
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    std::vector<std::vector<at::Tensor>> lists;
    lists.reserve(tensors.size());
    for (auto& tensor : tensors) {
        lists.push_back({tensor});
        c10d::AllreduceOptions options;
        options.reduceOp = c10d::ReduceOp::SUM;
#if BATCHPILOT_HAVE_NCCL
        if (m_impl->nccl && tensor.is_cuda()) {
            works.push_back(m_impl->nccl->allreduce(lists.back(), options));
            continue;
        }
#endif
        works.push_back(m_impl->group->allreduce(lists.back(), options));
    }
    // NCCL's wait orders the current CUDA stream after the sum; the host waits for it too, so that
    // the step's all-reduce time is what it took.
    for (auto& work : works) work->wait(m_impl->timeout);
#if BATCHPILOT_HAVE_NCCL
    if (m_impl->nccl)
        for (const auto& tensor : tensors)
            if (tensor.is_cuda()) {
                c10::cuda::getCurrentCUDAStream(tensor.device().index()).synchronize();
                break;
            }
#endif
}

std::string ProcessGroupLink::ncclPlace() const {
#if BATCHPILOT_HAVE_NCCL
    if (collectivesAsked() == "gloo") return {};
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) return "localhost";
    return host;
#else
    return {};
#endif
}

void ProcessGroupLink::useNccl(bool on) {
#if BATCHPILOT_HAVE_NCCL
    Impl& impl = *m_impl;
    impl.nccl.reset();
    if (!on) return;
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = impl.timeout;
    auto store = c10::make_intrusive<c10d::PrefixStore>("nccl/" + std::to_string(++impl.ncclGroups), impl.tcp);
    impl.nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank(), size(), options);
#else
    if (on) throw std::runtime_error("this build's LibTorch has no NCCL");
#endif
}

std::string ProcessGroupLink::collectives() const {
#if BATCHPILOT_HAVE_NCCL
    if (m_impl->nccl) return "NCCL";
#endif
    return "Gloo";
}

void ProcessGroupLink::broadcast(std::vector<at::Tensor>& tensors, int root) {
    CountingScope uncounted(false);
    for (auto& tensor : tensors) {
        std::vector<at::Tensor> list{tensor};
        c10d::BroadcastOptions options;
        options.rootRank = root;
        m_impl->group->broadcast(list, options)->wait(m_impl->timeout);
    }
}

std::vector<double> ProcessGroupLink::allGather(const std::vector<double>& mine) {
    CountingScope uncounted(false);
    const auto width = static_cast<int64_t>(mine.size());
    // One slot per rank, zero elsewhere: the sum is every rank's values side by side, exactly.
    at::Tensor slots = torch::zeros({size() * width}, torch::kFloat64);
    if (width > 0) {
        slots.narrow(0, rank() * width, width)
            .copy_(torch::from_blob(const_cast<double*>(mine.data()), {width}, torch::kFloat64));
    }
    std::vector<at::Tensor> list{slots};
    allReduceSum(list);
    const double* data = slots.data_ptr<double>();
    return {data, data + size() * width};
}

std::vector<std::string> ProcessGroupLink::exchangeText(const std::string& name, const std::string& mine) {
    auto& store = *m_impl->store;
    store.set(name + "/" + std::to_string(rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
    std::vector<std::string> all;
    for (int r = 0; r < size(); ++r) {
        const std::vector<uint8_t> value = store.get(name + "/" + std::to_string(r));
        all.emplace_back(value.begin(), value.end());
    }
    return all;
}

void ProcessGroupLink::markDone(const std::string& name) {
    m_impl->store->set("done/" + name, std::vector<uint8_t>{1});
}

void ProcessGroupLink::waitWhileAlive(const std::string& name, int other) {
    int64_t last = -1;
    auto changed = std::chrono::steady_clock::now();
    while (!m_impl->store->check({"done/" + name})) {
        // A rank that failed says so before it leaves: no need to wait for its heartbeat to stop.
        if (m_impl->store->check({"failed/" + std::to_string(other)}))
            throw std::runtime_error("rank " + std::to_string(other) + " failed while this rank waited for \"" + name +
                                     "\"");
        const int64_t now = m_impl->beats(other);
        if (now != last) {
            last = now;
            changed = std::chrono::steady_clock::now();
        } else if (std::chrono::steady_clock::now() - changed >
                   std::max<std::chrono::milliseconds>(m_impl->timeout, 4 * kBeat)) {
            throw std::runtime_error("rank " + std::to_string(other) +
                                     " stopped beating while this rank waited for \"" + name + "\"");
        }
        std::this_thread::sleep_for(kBeat / 2);
    }
}

namespace {

/// A failure's message is one rank's sentence, not a log: the store keeps at most this much.
constexpr size_t kFailureBytes = 2000;

}  // namespace

void ProcessGroupLink::reportFailure(const std::string& message) {
    if (!m_impl->store) return;
    try {
        const std::string text = message.substr(0, kFailureBytes);
        m_impl->store->set("failed/" + std::to_string(rank()), std::vector<uint8_t>(text.begin(), text.end()));
    } catch (const std::exception&) {
        // The store is gone (it lived with rank 0): the others learn only that this rank left.
    }
}

std::string ProcessGroupLink::failedRanks(const std::vector<std::string>& devices) {
    if (!m_impl->store) return {};
    std::string failed;
    try {
        for (int r = 0; r < size(); ++r) {
            const std::string key = "failed/" + std::to_string(r);
            if (r == rank() || !m_impl->store->check({key})) continue;
            const std::vector<uint8_t> value = m_impl->store->get(key);
            failed += (failed.empty() ? "" : "; ") + rankName(r, devices) +
                      " failed: " + std::string(value.begin(), value.end());
        }
    } catch (const std::exception&) {
        // The store is gone: what was read so far.
    }
    return failed;
}

std::string ProcessGroupLink::unresponsiveRanks(const std::vector<std::string>& devices) {
    std::vector<int64_t> before(static_cast<size_t>(size()), -1);
    try {
        for (int r = 0; r < size(); ++r) before[static_cast<size_t>(r)] = m_impl->beats(r);
        std::this_thread::sleep_for(4 * kBeat);
        std::string silent;
        for (int r = 0; r < size(); ++r) {
            if (r == rank() || m_impl->beats(r) != before[static_cast<size_t>(r)]) continue;
            silent += (silent.empty() ? "" : ", ") + rankName(r, devices);
        }
        return silent;
    } catch (const std::exception&) {
        // The store itself is gone: it lived with rank 0 (a job without the launcher).
        return rank() == 0 ? std::string() : rankName(0, devices) + ", which held the job's store,";
    }
}

struct StoreHost::Impl {
    c10::intrusive_ptr<c10d::TCPStore> store;
};

StoreHost::StoreHost(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}
StoreHost::~StoreHost() = default;

tl::expected<std::unique_ptr<StoreHost>, std::string> StoreHost::start() {
    auto impl = std::make_unique<Impl>();
    try {
        c10d::TCPStoreOptions options;
        options.port = 0;  // any free port: read back with port()
        options.isServer = true;
        options.waitWorkers = false;
        impl->store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    } catch (const std::exception& e) {
        return tl::make_unexpected("could not start the job's store on 127.0.0.1: " + firstMessageLine(e.what()));
    }
    return std::unique_ptr<StoreHost>(new StoreHost(std::move(impl)));
}

int StoreHost::port() const {
    return m_impl->store->getPort();
}

#else  // no Gloo headers in this build

namespace {
const std::string kNoGloo =
    "this build of BatchPilot has no Gloo (its headers were missing when it was built: install "
    "libgloo-dev and build again), so it trains on one device only";
}

struct ProcessGroupLink::Impl {
    RankEnvironment where;
    std::chrono::milliseconds timeout{0};
};
tl::expected<void, std::string> ProcessGroupLink::connect() {
    return tl::make_unexpected(kNoGloo);
}
void ProcessGroupLink::allReduceSum(std::vector<at::Tensor>&) {
    throw std::runtime_error(kNoGloo);
}
std::string ProcessGroupLink::ncclPlace() const {
    return {};
}
void ProcessGroupLink::useNccl(bool on) {
    if (on) throw std::runtime_error(kNoGloo);
}
std::string ProcessGroupLink::collectives() const {
    return "Gloo";
}
void ProcessGroupLink::broadcast(std::vector<at::Tensor>&, int) {
    throw std::runtime_error(kNoGloo);
}
std::vector<double> ProcessGroupLink::allGather(const std::vector<double>&) {
    throw std::runtime_error(kNoGloo);
}
std::vector<std::string> ProcessGroupLink::exchangeText(const std::string&, const std::string&) {
    throw std::runtime_error(kNoGloo);
}
void ProcessGroupLink::markDone(const std::string&) {
    throw std::runtime_error(kNoGloo);
}
void ProcessGroupLink::waitWhileAlive(const std::string&, int) {
    throw std::runtime_error(kNoGloo);
}
std::string ProcessGroupLink::unresponsiveRanks(const std::vector<std::string>&) {
    return {};
}
void ProcessGroupLink::reportFailure(const std::string&) {}
std::string ProcessGroupLink::failedRanks(const std::vector<std::string>&) {
    return {};
}
struct StoreHost::Impl {};
StoreHost::StoreHost(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}
StoreHost::~StoreHost() = default;
tl::expected<std::unique_ptr<StoreHost>, std::string> StoreHost::start() {
    return tl::make_unexpected(kNoGloo);
}
int StoreHost::port() const {
    return 0;
}

#endif

// Both builds: a link is made deferred and joins through connect(), which says why it cannot
// where this build has no Gloo.
ProcessGroupLink::ProcessGroupLink(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}
ProcessGroupLink::~ProcessGroupLink() = default;

std::shared_ptr<ProcessGroupLink> ProcessGroupLink::deferred(const RankEnvironment& where,
                                                             std::chrono::milliseconds timeout) {
    auto impl = std::make_unique<Impl>();
    impl->where = where;
    impl->timeout = timeout;
    return std::shared_ptr<ProcessGroupLink>(new ProcessGroupLink(std::move(impl)));
}

tl::expected<std::shared_ptr<ProcessGroupLink>, std::string> ProcessGroupLink::join(const RankEnvironment& where,
                                                                                    std::chrono::milliseconds timeout) {
    auto link = deferred(where, timeout);
    if (auto connected = link->connect(); !connected) return tl::make_unexpected(connected.error());
    return link;
}

std::vector<std::pair<std::string, std::string>> localRankVariables(int rank, int worldSize, int port,
                                                                    long launcherPid) {
    const std::string world = std::to_string(worldSize);
    return {{"RANK", std::to_string(rank)},
            {"LOCAL_RANK", std::to_string(rank)},
            {"WORLD_SIZE", world},
            {"LOCAL_WORLD_SIZE", world},
            {"MASTER_ADDR", "127.0.0.1"},
            {"MASTER_PORT", std::to_string(port)},
            {"TORCHELASTIC_USE_AGENT_STORE", "True"},
            {kLauncherPidVariable, std::to_string(launcherPid)}};
}

std::string glooInterfaceProblem() {
    const std::vector<std::string> names = glooInterfaces();
    std::string missing;
    for (const std::string& name : names)
        if (if_nametoindex(name.c_str()) == 0) missing += (missing.empty() ? "" : ", ") + name;
    if (missing.empty()) return {};
    std::string here;
    if (struct if_nameindex* list = if_nameindex(); list != nullptr) {
        for (const struct if_nameindex* i = list; i->if_index != 0 && i->if_name != nullptr; ++i)
            here += (here.empty() ? "" : ", ") + std::string(i->if_name);
        if_freenameindex(list);
    }
    return "the environment variable GLOO_SOCKET_IFNAME=\"" + std::string(std::getenv("GLOO_SOCKET_IFNAME")) +
           "\": this machine has no network interface called " + missing + " (it has " +
           (here.empty() ? std::string("none that could be listed") : here) +
           "): name the one the ranks reach each other through, or unset it";
}

int threadsPerLocalRank(int cpus, int ranksHere) {
    return std::max(1, cpus / std::max(1, ranksHere));
}

// Known before the link connects (both builds).
int ProcessGroupLink::rank() const {
    return m_impl->where.rank;
}
int ProcessGroupLink::size() const {
    return m_impl->where.worldSize;
}
std::chrono::milliseconds ProcessGroupLink::timeout() const {
    return m_impl->timeout;
}
bool ProcessGroupLink::ncclRequired() {
    return collectivesAsked() == "nccl";
}
std::string ProcessGroupLink::collectivesProblem() {
    const std::string asked = collectivesAsked();
    if (asked.empty() || asked == "gloo" || asked == "nccl") return {};
    return "the environment variable BATCHPILOT_COLLECTIVES=\"" + std::string(std::getenv("BATCHPILOT_COLLECTIVES")) +
           "\" is not gloo or nccl: set gloo to sum the gradients with Gloo, nccl to require NCCL, or unset it "
           "(NCCL where every rank has a GPU of its own)";
}

}  // namespace batchpilot::core
