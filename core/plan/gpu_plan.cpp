#include "core/plan/gpu_plan.h"

#include <algorithm>
#include <cmath>

#include "core/base/byte_size.h"
#include "core/base/text_format.h"
#include "core/memory/gpu_presets.h"
#include "core/plan/accumulation_plan.h"

namespace batchpilot::core {
namespace {

GpuPlanTarget targetOf(const GpuPreset& preset) {
    return {"virtual:" + std::string(preset.name), std::string(preset.description), preset.capacityBytes,
            cudaContextBytes(preset), cublasWorkspaceBytes(preset)};
}

}  // namespace

tl::expected<std::vector<GpuPlanTarget>, std::string> gpuPlanTargets(std::string_view text) {
    std::vector<GpuPlanTarget> targets;
    if (text == "all") {
        for (const GpuPreset& preset : gpuPresets()) targets.push_back(targetOf(preset));
        return targets;
    }
    size_t start = 0;
    while (start <= text.size()) {
        const size_t comma = std::min(text.find(',', start), text.size());
        std::string_view name = text.substr(start, comma - start);
        start = comma + 1;
        if (name.starts_with("virtual:")) name.remove_prefix(8);
        if (name.empty()) continue;
        const GpuPreset* preset = findGpuPreset(name);
        if (preset == nullptr) {
            return tl::unexpected("no GPU preset is called " + quoteForMessage(std::string(name)) +
                                  ": write all, or some of " + gpuPresetNames());
        }
        targets.push_back(targetOf(*preset));
    }
    if (targets.empty()) return tl::unexpected(std::string("name at least one GPU preset, or all"));
    return targets;
}

std::vector<GpuPlanRow> planForGpus(const std::vector<GpuPlanTarget>& targets, double fixedBytes, double bytesPerSample,
                                    int64_t probeWorkspaceBytes, int64_t targetBatch, double headroom) {
    std::vector<GpuPlanRow> rows;
    for (const GpuPlanTarget& target : targets) {
        GpuPlanRow row;
        row.target = target;
        row.usableBytes =
            static_cast<int64_t>(static_cast<double>(target.capacityBytes - target.contextBytes) * (1.0 - headroom));
        const double fixed =
            fixedBytes - static_cast<double>(probeWorkspaceBytes) + static_cast<double>(target.workspaceBytes);
        row.neededBytes = static_cast<int64_t>(std::ceil(fixed + bytesPerSample));
        if (bytesPerSample > 0 && static_cast<double>(row.usableBytes) >= fixed + bytesPerSample) {
            const double most = std::floor((static_cast<double>(row.usableBytes) - fixed) / bytesPerSample);
            row.microBatch = std::min<int64_t>(targetBatch, static_cast<int64_t>(most));
            row.peakBytes = static_cast<int64_t>(fixed + bytesPerSample * static_cast<double>(row.microBatch));
            row.plan = EvenSplit::of(targetBatch, row.microBatch).sum();
        }
        rows.push_back(std::move(row));
    }
    return rows;
}

std::string formatGpuPlan(const std::vector<GpuPlanRow>& rows, const std::string& measuredOn, int64_t targetBatch) {
    std::string out = "The plan on each GPU, predicted from the memory line measured on " + measuredOn +
                      " (target batch " + std::to_string(targetBatch) + "):\n";
    out += formatText("  %-20s %12s %12s  %s\n", "device", "usable", "micro-batch", "target batch =");
    for (const GpuPlanRow& row : rows) {
        if (row.microBatch > 0) {
            out +=
                formatText("  %-20s %12s %12lld  %s\n", row.target.device.c_str(), formatBytes(row.usableBytes).c_str(),
                           static_cast<long long>(row.microBatch), row.plan.c_str());
        } else {
            out += formatText("  %-20s %12s %12s  does not fit: one sample needs about %s\n", row.target.device.c_str(),
                              formatBytes(row.usableBytes).c_str(), "-", formatBytes(row.neededBytes).c_str());
        }
    }
    return out;
}

}  // namespace batchpilot::core
