#include "core/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace batchpilot::core {

Sampler::Sampler(int64_t size, uint64_t seed) : m_size(size), m_seed(seed) {
    shuffle();
}

void Sampler::shuffle() {
    m_order.resize(static_cast<size_t>(m_size));
    std::iota(m_order.begin(), m_order.end(), 0);
    std::seed_seq seq{static_cast<uint32_t>(m_seed), static_cast<uint32_t>(m_seed >> 32),
                      static_cast<uint32_t>(m_epoch)};
    std::mt19937_64 engine(seq);
    // Fisher–Yates written out: std::shuffle's algorithm is left to the library.
    for (int64_t i = m_size - 1; i > 0; --i) {
        const auto j = static_cast<int64_t>(engine() % static_cast<uint64_t>(i + 1));
        std::swap(m_order[static_cast<size_t>(i)], m_order[static_cast<size_t>(j)]);
    }
    m_position = 0;
}

void Sampler::restore(int64_t epoch, int64_t position) {
    m_epoch = epoch;
    m_batchEpoch = epoch;
    shuffle();
    m_position = std::clamp<int64_t>(position, 0, m_size);
}

std::vector<int64_t> Sampler::next(int64_t target) {
    if (m_position >= m_size) {
        ++m_epoch;
        shuffle();
    }
    m_batchEpoch = m_epoch;
    const int64_t count = std::min(target, m_size - m_position);
    std::vector<int64_t> batch(m_order.begin() + m_position, m_order.begin() + m_position + count);
    m_position += count;
    return batch;
}

}  // namespace batchpilot::core
