#include "core/accumulation_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace batchpilot::core {

AccumulationPlan::AccumulationPlan(int64_t target, int64_t microBatch)
    : m_target(target), m_microBatch(std::min(microBatch, target)) {
    if (target <= 0 || microBatch <= 0) {
        throw std::invalid_argument("accumulation plan needs positive sizes, got target " + std::to_string(target) +
                                    " and micro-batch " + std::to_string(microBatch));
    }
    m_sizes = split(m_target, m_microBatch);
}

std::vector<int64_t> AccumulationPlan::split(int64_t remaining, int64_t microBatch) {
    if (remaining <= 0) {
        return {};
    }
    microBatch = std::max<int64_t>(1, std::min(microBatch, remaining));
    const int64_t count = (remaining + microBatch - 1) / microBatch;
    const int64_t base = remaining / count;
    const int64_t larger = remaining % count;  // this many micro-batches get one extra sample
    std::vector<int64_t> sizes(static_cast<size_t>(count), base);
    for (int64_t i = 0; i < larger; ++i) {
        ++sizes[static_cast<size_t>(i)];
    }
    return sizes;
}

int64_t AccumulationPlan::offset(int64_t i) const {
    int64_t total = 0;
    for (int64_t j = 0; j < i; ++j) {
        total += m_sizes[static_cast<size_t>(j)];
    }
    return total;
}

double AccumulationPlan::weight(int64_t i) const {
    return static_cast<double>(m_sizes[static_cast<size_t>(i)]) / static_cast<double>(m_target);
}

}  // namespace batchpilot::core
