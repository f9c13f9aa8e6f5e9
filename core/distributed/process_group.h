#pragma once

// The processes of a data-parallel job, joined into one c10d process group (Gloo) through a
// c10d::TCPStore rendezvous, with torchrun's conventions: RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT, and TORCHELASTIC_USE_AGENT_STORE when the launcher hosts the store
// (batchpilot-cli --devices does). The collectives are c10d's; this file only names what the
// trainer needs from them (docs/ARCHITECTURE.md, "Several devices").
//
// The header is torch-free for the front ends; the tensor methods take LibTorch tensors, which
// only the engine's files (which include torch) can call.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <tl/expected.hpp>

namespace at {
class Tensor;
}

namespace batchpilot::core {

/// Where this process stands in a job, read from torchrun's environment variables.
struct RankEnvironment {
    int rank = 0;
    int worldSize = 1;
    int localRank = 0;
    /// Ranks on this machine (LOCAL_WORLD_SIZE); 0 when unset.
    int localWorldSize = 0;
    std::string masterAddress = "127.0.0.1";
    int masterPort = 29500;
    /// The launcher hosts the store (TORCHELASTIC_USE_AGENT_STORE=True): rank 0 does not.
    bool agentStore = false;
};

/// This process's place in a job, or nullopt when WORLD_SIZE is unset (a single process). A
/// malformed or inconsistent variable is an error that names it and the valid values.
tl::expected<std::optional<RankEnvironment>, std::string> rankEnvironment();

/// GLOO_SOCKET_IFNAME (as in PyTorch: the network interface Gloo connects through, or several
/// separated by commas): what is wrong with it on this machine, naming the interfaces it has;
/// empty when it is unset or every name is an interface here.
std::string glooInterfaceProblem();

/// The ranks of one job, joined; every collective blocks until every rank called it, or fails
/// (throws std::runtime_error) after the timeout, or as soon as a rank's connection closes.
class ProcessGroupLink {
public:
    /// Connects to the store and the other ranks; waits for them up to `timeout`.
    static tl::expected<std::shared_ptr<ProcessGroupLink>, std::string> join(const RankEnvironment& where,
                                                                             std::chrono::milliseconds timeout);
    /// A link that connects on its first connect() (the trainer's setup calls it, on the run
    /// thread): for a front end that must not wait for the other ranks on its own thread.
    static std::shared_ptr<ProcessGroupLink> deferred(const RankEnvironment& where, std::chrono::milliseconds timeout);
    /// Connects, once (later calls return at once); the error says what failed and what to check.
    tl::expected<void, std::string> connect();
    ~ProcessGroupLink();
    ProcessGroupLink(const ProcessGroupLink&) = delete;
    ProcessGroupLink& operator=(const ProcessGroupLink&) = delete;

    int rank() const;
    int size() const;
    std::chrono::milliseconds timeout() const;

    /// Sums each tensor over the ranks, in place; all of them are launched before any is waited
    /// for, so Gloo works on them back to back (the caller passes a few large buckets). CUDA
    /// tensors go through NCCL after useNccl(true), GPU to GPU.
    void allReduceSum(std::vector<at::Tensor>& tensors);
    /// Where NCCL could sum this rank's CUDA tensors: this host's name, when this build's LibTorch
    /// has NCCL (a CUDA LibTorch) and BATCHPILOT_COLLECTIVES is not "gloo"; empty otherwise.
    std::string ncclPlace() const;
    /// BATCHPILOT_COLLECTIVES=nccl: a job NCCL does not fit is an error rather than Gloo's.
    static bool ncclRequired();
    /// What is wrong with BATCHPILOT_COLLECTIVES (not gloo, nccl or unset); empty when nothing.
    static std::string collectivesProblem();
    /// From now on (every rank at the same point) CUDA tensors are summed by NCCL in a
    /// communicator of their own (a new one each time: a rank may have moved to another GPU),
    /// or, with false, by Gloo again.
    void useNccl(bool on);
    /// What sums the gradients: "NCCL" or "Gloo".
    std::string collectives() const;
    /// Replaces every rank's tensors with rank `root`'s.
    void broadcast(std::vector<at::Tensor>& tensors, int root);
    /// Every rank's `mine`, rank after rank (each rank must pass as many values).
    std::vector<double> allGather(const std::vector<double>& mine);
    /// Every rank's text under `name` (through the store; once per name).
    std::vector<std::string> exchangeText(const std::string& name, const std::string& mine);

    /// Announces that this rank finished `name` (a key in the job's store).
    void markDone(const std::string& name);
    /// Waits until rank `other` marked `name` done, however long that takes while its heartbeat
    /// goes on; throws std::runtime_error when `other` reported a failure (reportFailure), or
    /// when its heartbeat stops for the link's timeout (the
    /// other ranks wait so for rank 0's validation pass, which may take longer than a collective
    /// is allowed to).
    void waitWhileAlive(const std::string& name, int other);
    /// After a collective failed: the ranks that stopped answering, as "rank 1 (virtual:48MiB)"
    /// when `devices` names them; empty when every other rank is still alive. Every rank beats
    /// a counter in the store twice a second from a thread of its own (a stopped or dead process
    /// does not); this compares the counters over two seconds.
    std::string unresponsiveRanks(const std::vector<std::string>& devices);
    /// This rank failed with `message` (before it leaves): the others name the cause when their
    /// collectives fail, rather than only that this rank is gone. Best effort: never throws.
    void reportFailure(const std::string& message);
    /// The other ranks that reported a failure, as "rank 2 (virtual:160MiB) failed: <message>",
    /// joined by "; "; empty when none did (or the store is gone).
    std::string failedRanks(const std::vector<std::string>& devices);

private:
    struct Impl;
    explicit ProcessGroupLink(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

/// Set by a launcher in its workers' environment: its process id (a worker whose launcher is gone
/// stops).
inline constexpr const char* kLauncherPidVariable = "BATCHPILOT_LAUNCHER_PID";

/// The variables a launcher on this machine gives rank `rank` of a job of `worldSize` ranks, all
/// on this machine, whose store it hosts on 127.0.0.1:`port`: torchrun's (RANK, LOCAL_RANK,
/// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE) and
/// BATCHPILOT_LAUNCHER_PID (`launcherPid`, which the worker watches), as (name, value). The CLI's
/// launcher and the app both start their workers with these.
std::vector<std::pair<std::string, std::string>> localRankVariables(int rank, int worldSize, int port,
                                                                    long launcherPid);
/// The intra-op threads of one of `ranksHere` ranks sharing this machine's `cpus`: its part of
/// them, at least one (each taking them all oversubscribes: 2 ranks × 2 threads on 2 cores).
int threadsPerLocalRank(int cpus, int ranksHere);

/// The launcher's store: a c10d::TCPStore server on 127.0.0.1 at a port the system picks, which
/// the local workers join as clients (TORCHELASTIC_USE_AGENT_STORE).
class StoreHost {
public:
    static tl::expected<std::unique_ptr<StoreHost>, std::string> start();
    ~StoreHost();
    StoreHost(const StoreHost&) = delete;
    StoreHost& operator=(const StoreHost&) = delete;
    int port() const;

private:
    struct Impl;
    explicit StoreHost(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

}  // namespace batchpilot::core
