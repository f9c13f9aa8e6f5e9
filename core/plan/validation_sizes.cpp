#include "core/plan/validation_sizes.h"

#include <algorithm>

namespace batchpilot::core {

void ValidationSizes::begin(int64_t total, int64_t training) {
    training = std::max<int64_t>(1, training);
    m_cap = std::max<int64_t>(1, std::min(total, std::max<int64_t>(256, 4 * training)));
    m_size = m_next > 0 ? m_next : std::min(m_cap, training);
    if (m_ceiling > 0) m_size = std::min(m_size, std::max<int64_t>(1, m_ceiling / 2));
}

bool ValidationSizes::outOfMemory(int64_t n) {
    if (n <= 1) return false;
    m_ceiling = n;
    m_size = std::max<int64_t>(1, n / 2);
    return true;
}

void ValidationSizes::ran(int64_t n, int64_t resident, int64_t activations, int64_t usable) {
    const bool roomForTwice = resident + 2 * activations <= usable;
    const bool belowFailure = m_ceiling == 0 || 2 * m_size < m_ceiling;
    if (n == m_size && roomForTwice && belowFailure && 2 * m_size <= m_cap) m_size *= 2;
}

}  // namespace batchpilot::core
