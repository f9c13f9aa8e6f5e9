#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace batchpilot::core {

/// The split rule without the list of sizes (for views of huge batches): `parts` micro-batches,
/// the first `larger` of them `base + 1` samples, the rest `base`. AccumulationPlan::split and
/// every view of a plan use it.
struct EvenSplit {
    int64_t parts = 0;
    int64_t base = 0;
    int64_t larger = 0;

    /// `total` samples in micro-batches of at most `microBatch` (capped at total; both positive,
    /// or an empty split).
    static EvenSplit of(int64_t total, int64_t microBatch);
    int64_t sizeOf(int64_t i) const { return base + (i < larger ? 1 : 0); }
    /// Samples before micro-batch i.
    int64_t offsetOf(int64_t i) const { return i * base + std::min(i, larger); }
    /// The sizes as a sum a person can check: "4 × 256", or "1 × 94 + 10 × 93" (larger first).
    std::string sum() const;
};

/// How one training batch of `target` samples is split into micro-batches of at most
/// `microBatch` samples: k = ceil(target / microBatch) micro-batches whose sizes differ by at most
/// one (100 at 32 → 25, 25, 25, 25), largest first. Micro-batch i's mean loss is weighted by
/// n_i / target, so the accumulated gradient is the full batch's mean gradient.
class AccumulationPlan {
public:
    /// Both arguments must be positive; microBatch is capped at target.
    AccumulationPlan(int64_t target, int64_t microBatch);

    int64_t target() const { return m_target; }
    /// The micro-batch size the plan was made for (after capping).
    int64_t microBatch() const { return m_microBatch; }
    /// Number of micro-batches (accumulation steps).
    int64_t steps() const { return static_cast<int64_t>(m_sizes.size()); }
    const std::vector<int64_t>& sizes() const { return m_sizes; }
    /// Offset of micro-batch i within the training batch.
    int64_t offset(int64_t i) const;
    /// n_i / target.
    double weight(int64_t i) const;

    /// Splits `remaining` samples (the tail of a batch) with the same rule.
    static std::vector<int64_t> split(int64_t remaining, int64_t microBatch);

private:
    int64_t m_target;
    int64_t m_microBatch;
    std::vector<int64_t> m_sizes;
};

}  // namespace batchpilot::core
