#pragma once

// How a training batch is split between the ranks of a data-parallel job (docs/ARCHITECTURE.md,
// "Several devices"): every rank takes a contiguous share of the batch's sample order, the
// shares add up to the batch, and they follow each rank's measured speed so that the ranks reach
// the gradient all-reduce at about the same time. Plain arithmetic: no torch, no processes.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace batchpilot::core {

/// Splits `total` into one share per weight, proportional to the weights (largest remainder,
/// ties to the lower rank), every share at least `minShare` when the total allows it (otherwise
/// the first ranks get what there is). Weights that are not positive count as the smallest
/// positive one; all zero: an equal split.
std::vector<int64_t> splitShares(int64_t total, const std::vector<double>& weights, int64_t minShare = 1);

/// The shares of a batch shorter than the target (the end of an epoch): `shares` scaled to
/// `total` with splitShares, so the ranks keep their proportions.
std::vector<int64_t> scaleShares(const std::vector<int64_t>& shares, int64_t total, int64_t minShare = 1);

/// Where rank `rank`'s share starts in the batch: the shares of the ranks before it.
int64_t shareOffset(const std::vector<int64_t>& shares, int rank);

/// One rank's step, as every rank learns it from the step's exchange.
struct RankStepTiming {
    int64_t share = 0;          ///< samples it trained in the step
    double computeSeconds = 0;  ///< from the batch's start until its gradients were ready
    bool settled = true;        ///< not probing in the step (trials say nothing of the speed)
};

/// Moves the shares towards the ranks' measured speed (samples per second of computing), so the
/// fastest rank does not wait for the slowest. Every rank runs one with the same inputs and so
/// decides the same shares: nothing else is agreed.
class ShareBalancer {
public:
    struct Options {
        /// A new split when the slowest rank computes this much longer than the fastest (1.1: 10%).
        double imbalance = 1.10;
        /// Settled steps measured before the first change and between two changes.
        int stepsBetween = 3;
        /// Weight of the newest step in the running speed (exponential average).
        double smoothing = 0.5;
        int64_t minShare = 1;
    };

    explicit ShareBalancer(Options options) : m_options(options) {}

    /// Records a step at `shares` (one timing per rank); returns the new shares for the next
    /// batch of `target` samples when the ranks finished too far apart, with the reason in words.
    struct Change {
        std::vector<int64_t> shares;
        std::string reason;
    };
    std::optional<Change> observe(const std::vector<RankStepTiming>& step, const std::vector<int64_t>& shares,
                                  int64_t target);
    /// Forgets the measured speeds (new micro-batches, devices or target: the old numbers no
    /// longer hold).
    void reset();
    /// Slowest over fastest compute time of the last step (1: perfectly balanced; 0: none yet).
    double lastImbalance() const { return m_lastImbalance; }

private:
    Options m_options;
    std::vector<double> m_speed;  ///< samples/s per rank, smoothed
    int m_settledSteps = 0;
    double m_lastImbalance = 0;
};

/// How messages name a rank: "rank 1 (virtual:48MiB)", or "rank 1" where `devices` (the job's
/// devices, by rank) does not name it.
std::string rankName(int rank, const std::vector<std::string>& devices);

/// What sums the gradients of a job: NCCL when every rank could use it (`places`: each rank's
/// ProcessGroupLink::ncclPlace(), its host, empty where it cannot) and every rank is on a GPU of
/// its own: every device "cuda:N", no two ranks on the same GPU of the same host (NCCL refuses
/// that). Otherwise Gloo (it takes CUDA tensors too, through host memory), and why.
struct CollectivesChoice {
    bool nccl = false;
    std::string why;  ///< when Gloo: the reason, e.g. "rank 1 (virtual:48MiB) is not on a GPU"
};
CollectivesChoice chooseCollectives(const std::vector<std::string>& devices, const std::vector<std::string>& places);

}  // namespace batchpilot::core
