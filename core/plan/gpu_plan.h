#pragma once

// The plan for every GPU you might get: from one probe's fitted memory line (on any device, a
// virtual one included), the largest micro-batch and the accumulation each GPU preset would
// give for the target batch, and whether the model fits there at all.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tl/expected.hpp>

namespace batchpilot::core {

/// A device to plan for: a GPU preset, or any budget (tests check predictions on those).
struct GpuPlanTarget {
    std::string device;          ///< "virtual:T4"
    std::string description;     ///< "NVIDIA T4 16 GB"
    int64_t capacityBytes = 0;   ///< what PyTorch reports as the total
    int64_t contextBytes = 0;    ///< outside the allocator (a CUDA context)
    int64_t workspaceBytes = 0;  ///< held through the allocator (cuBLAS's workspace)
};

/// The targets `text` names: "all" (every preset) or a comma-separated list of preset names
/// ("T4,A100-40GB", "virtual:" optional). An unknown name is an error listing the presets.
tl::expected<std::vector<GpuPlanTarget>, std::string> gpuPlanTargets(std::string_view text);

struct GpuPlanRow {
    GpuPlanTarget target;
    int64_t usableBytes = 0;  ///< (capacity − context) × (1 − headroom)
    int64_t microBatch = 0;   ///< predicted largest, at most the target batch; 0: does not fit
    std::string plan;         ///< "4 × 128" for the target batch; empty when it does not fit
    int64_t peakBytes = 0;    ///< predicted peak at that micro-batch
    int64_t neededBytes = 0;  ///< at one sample, for a model that does not fit
};

/// The memory line measured on the probe's device — peak ≈ fixed + perSample × n, reserved
/// bytes, `probeWorkspaceBytes` of the fixed part being that device's workspace — carried to each
/// target: the largest n whose peak stays within the target's usable memory.
std::vector<GpuPlanRow> planForGpus(const std::vector<GpuPlanTarget>& targets, double fixedBytes, double bytesPerSample,
                                    int64_t probeWorkspaceBytes, int64_t targetBatch, double headroom);

/// The rows as a table for the terminal, with a heading that names what it was measured on.
std::string formatGpuPlan(const std::vector<GpuPlanRow>& rows, const std::string& measuredOn, int64_t targetBatch);

}  // namespace batchpilot::core
