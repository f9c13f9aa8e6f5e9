#include "core/plan/micro_batch_sizes.h"

#include <algorithm>

#include "core/plan/accumulation_plan.h"

namespace batchpilot::core {

std::vector<int64_t> MicroBatchSizes::planFor(int64_t remaining, int64_t micro) const {
    std::vector<int64_t> sizes = AccumulationPlan::split(remaining, micro);
    if (sizes.size() >= 2 && sizes.back() < minPart) {
        sizes[sizes.size() - 2] += sizes.back();
        sizes.pop_back();
    }
    return sizes;
}

void MicroBatchSizes::requireTwoSamples() {
    minMicroBatch = 2;
    minPart = std::max<int64_t>(minPart, 2);
}

bool MicroBatchSizes::retrySingleSample(int64_t size) {
    if (size != 1 || singleSampleOoms >= kSingleSampleRetries) return false;
    ++singleSampleOoms;
    return true;
}

std::optional<int64_t> MicroBatchSizes::shrinkAfterOom(int64_t size) {
    if (size <= 1 || (size / 2 < minMicroBatch && microBatch <= minMicroBatch)) return std::nullopt;
    microBatch = std::max<int64_t>(minMicroBatch, size / 2);
    cleanStepsSinceShrink = 0;
    return microBatch;
}

bool MicroBatchSizes::thrashing(int64_t retriesInStep, bool settled) {
    thrashingSteps = retriesInStep > 0 && settled ? thrashingSteps + 1 : 0;
    if (thrashingSteps < kThrashingSteps) return false;
    thrashingSteps = 0;
    return true;
}

bool MicroBatchSizes::cleanStep(int regrowAfter) {
    if (cleanStepsSinceShrink < 0 || regrowAfter <= 0 || ++cleanStepsSinceShrink < regrowAfter) return false;
    cleanStepsSinceShrink = -1;
    return microBatch < probed;
}

}  // namespace batchpilot::core
