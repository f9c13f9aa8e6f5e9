#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "core/config/options.h"

namespace batchpilot::core {

/// One measured trial of the probe.
struct TrialOutcome {
    int64_t size = 0;       ///< micro-batch, samples
    bool fit = false;       ///< forward + backward completed without an OOM
    int64_t peakBytes = 0;  ///< peak device memory during the trial (fits only): reserved where the
                            ///< allocator caches, what the headroom line is drawn on
    /// Peak bytes held by tensors (fits only; 0: the same as peakBytes). Where the allocator
    /// caches, the reserved peak moves in segment-sized steps and saturates at the capacity (the
    /// allocator frees its cache and retries); the tensors' peak is the line the search predicts on.
    int64_t allocatedBytes = 0;
    /// Failures only: the bytes the device would have held with the allocation that failed (0:
    /// unknown), a lower bound on what the size needs.
    int64_t neededBytes = 0;
};

/// Memory model fitted to the probe's fits: peak ≈ fixedBytes + bytesPerSample · n.
struct MemoryModel {
    double fixedBytes = 0;
    double bytesPerSample = 0;
    /// Largest n predicted to stay within `usableBytes` (0 when none).
    int64_t largestWithin(int64_t usableBytes) const;
};

/// Least squares fit of peak = a + b·n over the trials that fit (one point per size, the last
/// measured; with `tensors`, each trial's allocatedBytes where it has them), using only the
/// `largest` largest sizes when it is not 0. With a `spread` (0..1) the
/// points are the largest size and then only sizes at most `spread` of it (all of the largest
/// sizes when none is that far below). Empty when fewer than two distinct sizes fit or the slope
/// is not positive.
std::optional<MemoryModel> fitMemoryModel(const std::vector<TrialOutcome>& trials, size_t largest = 0,
                                          double spread = 0, bool tensors = false);

/// The search for the largest micro-batch that fits, as a pure state machine: it proposes sizes,
/// the caller runs them and records the outcome. No tensors, so it is tested with synthetic
/// memory curves and reused by the benchmark.
///
/// 1. Grow: start at the initial size and double until a failure or the upper bound.
/// 2. Predict: once two sizes fit, fit peak = a + b·n by least squares and jump to the largest n
///    predicted to fit `usableBytes`; then confirm the other side of the tolerance band. A wrong
///    prediction just becomes one more bound.
/// 3. Refine: bisect between the largest accepted fit and the smallest failure until they are
///    adjacent or within `tolerance` of each other.
/// A fit whose peak exceeds `usableBytes` (the headroom line) counts as a failure for the search.
/// Sizes are multiples of `multipleOf` unless even that one does not fit.
class ProbeSearch {
public:
    /// `upperBound` ≥ 1 is the largest size allowed (target batch, dataset, user maximum).
    /// `knownFit` > 0 seeds the search with a size known to fit (re-probes start from there).
    ProbeSearch(const ProbeOptions& options, int64_t upperBound, int64_t usableBytes, int64_t knownFit = 0);

    /// Next size to try, or nothing when the search is over.
    std::optional<int64_t> next();
    /// Records the outcome of the size returned by next().
    void record(const TrialOutcome& outcome);

    /// Largest accepted size (0 when nothing fits even at 1).
    int64_t result() const { return m_lo; }
    /// Smallest size that failed or crossed the headroom line (0 when none did).
    int64_t smallestFailure() const { return m_failSeen ? m_hi : 0; }
    bool finished() const { return m_finished; }
    bool hitTrialLimit() const { return m_hitTrialLimit; }
    int trials() const { return static_cast<int>(m_history.size()); }
    const std::vector<TrialOutcome>& history() const { return m_history; }
    /// The fitted memory model the search predicts its next size with (the three largest fits),
    /// when two distinct sizes have fit.
    std::optional<MemoryModel> memoryModel() const;
    /// The memory line the probe reports (memoryLine's sizes spread out; see probe_search.cpp).
    std::optional<MemoryModel> memoryLine() const;
    int64_t usableBytes() const { return m_usable; }

private:
    bool converged() const;
    int64_t snap(int64_t size) const;
    std::optional<int64_t> candidate() const;
    int64_t interpolatedBelowFailure() const;
    /// A trial the search counts as fitting: it fit, and its peak stayed under the headroom line.
    bool accepts(const TrialOutcome& t) const { return t.fit && t.peakBytes <= m_usable; }

    ProbeOptions m_options;
    int64_t m_upperBound;
    int64_t m_usable;
    int64_t m_unit;
    int64_t m_lo = 0;
    int64_t m_hi = 0;  ///< valid when m_failSeen
    bool m_failSeen = false;
    int m_fitStreak = 0;
    int m_failStreak = 0;
    bool m_modelMissed = false;
    bool m_finished = false;
    bool m_hitTrialLimit = false;
    std::vector<TrialOutcome> m_history;
    std::set<int64_t> m_tried;
};

}  // namespace batchpilot::core
