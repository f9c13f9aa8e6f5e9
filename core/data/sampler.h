#pragma once

#include <cstdint>
#include <vector>

namespace batchpilot::core {

/// Seeded epoch sampler: every epoch is a fresh permutation of [0, size), drawn from the seed and
/// the epoch number only, so any run with the same seed sees the same order. Batches never span
/// two epochs: the last batch of an epoch may be shorter, and every sample is used exactly once
/// per epoch.
class Sampler {
public:
    Sampler(int64_t size, uint64_t seed);

    /// The next training batch: up to `target` sample indices from the current epoch.
    std::vector<int64_t> next(int64_t target);
    /// Epoch of the batch returned last (0-based).
    int64_t epoch() const { return m_batchEpoch; }
    /// Epochs fully consumed.
    int64_t completedEpochs() const { return m_epoch + (m_position >= m_size ? 1 : 0); }
    /// Position within the current epoch's order (samples handed out).
    int64_t position() const { return m_position; }
    /// Continues from a saved (epoch, position): the order is rebuilt from the seed.
    void restore(int64_t epoch, int64_t position);

private:
    void shuffle();

    int64_t m_size;
    uint64_t m_seed;
    int64_t m_epoch = 0;
    int64_t m_batchEpoch = 0;
    int64_t m_position = 0;
    std::vector<int64_t> m_order;
};

}  // namespace batchpilot::core
