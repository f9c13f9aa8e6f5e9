#include "core/plan/accumulation_plan.h"

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

EvenSplit EvenSplit::of(int64_t total, int64_t microBatch) {
    if (total <= 0 || microBatch <= 0) return {};
    microBatch = std::min(microBatch, total);
    const int64_t parts = (total + microBatch - 1) / microBatch;
    return {parts, total / parts, total % parts};  // `larger` parts get one extra sample
}

std::string EvenSplit::sum() const {
    if (parts <= 0) return "0";
    const auto term = [](int64_t count, int64_t size) { return std::to_string(count) + " × " + std::to_string(size); };
    if (larger == 0) return term(parts, base);
    return term(larger, base + 1) + " + " + term(parts - larger, base);
}

std::vector<int64_t> AccumulationPlan::split(int64_t remaining, int64_t microBatch) {
    const EvenSplit even = EvenSplit::of(remaining, std::max<int64_t>(1, microBatch));
    std::vector<int64_t> sizes(static_cast<size_t>(even.parts));
    for (int64_t i = 0; i < even.parts; ++i) sizes[static_cast<size_t>(i)] = even.sizeOf(i);
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
