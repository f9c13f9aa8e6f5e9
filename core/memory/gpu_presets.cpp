#include "core/memory/gpu_presets.h"

#include <array>
#include <cctype>

namespace batchpilot::core {
namespace {

constexpr int64_t MiB = 1024 * 1024;

// Capacities: the "GPU 0 has a total capacity of X GiB" that PyTorch's CUDA OOM message prints for
// the card (its cudaMemGetInfo total), as it recurs in users' reports of that card; the exact
// figure moves by ±0.1 GiB with the driver and ECC. Rounded here to the MiB of that GiB figure.
constexpr std::array kPresets{
    GpuPreset{"T4", "NVIDIA T4 16 GB", 15094 * MiB, 75, "14.74 GiB in PyTorch OOM reports from T4 notebooks"},
    GpuPreset{"L4", "NVIDIA L4 24 GB", 22559 * MiB, 89, "22.03 GiB in PyTorch OOM reports on L4 instances"},
    GpuPreset{"RTX4090", "NVIDIA GeForce RTX 4090 24 GB", 24207 * MiB, 89, "23.64 GiB in PyTorch OOM reports"},
    GpuPreset{"A100-40GB", "NVIDIA A100 40 GB (SXM4)", 40335 * MiB, 80, "39.39 GiB in PyTorch OOM reports"},
    GpuPreset{"A100-80GB", "NVIDIA A100 80 GB", 81050 * MiB, 80, "79.15 GiB in PyTorch OOM reports"},
    GpuPreset{"H100-80GB", "NVIDIA H100 80 GB (HBM3)", 81090 * MiB, 90, "79.18–79.21 GiB in PyTorch OOM reports"},
    GpuPreset{"H200", "NVIDIA H200 141 GB", 143155 * MiB, 90, "139.80 GiB in PyTorch OOM reports"},
};

std::string folded(std::string_view text) {
    std::string out;
    for (const char c : text) {
        if (c == '-' || c == '_') continue;
        out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    return out;
}

}  // namespace

std::span<const GpuPreset> gpuPresets() {
    return kPresets;
}

const GpuPreset* findGpuPreset(std::string_view name) {
    const std::string wanted = folded(name);
    for (const GpuPreset& preset : kPresets) {
        if (folded(preset.name) == wanted) return &preset;
    }
    return nullptr;
}

std::string gpuPresetNames() {
    std::string names;
    for (const GpuPreset& preset : kPresets) names += (names.empty() ? "" : ", ") + std::string(preset.name);
    return names;
}

int64_t cudaContextBytes(const GpuPreset& preset) {
    constexpr int64_t kLibraries = 238 * MiB;  // 765 − 527 MiB on the H200
    return preset.computeCapability >= 90 ? 527 * MiB + kLibraries : 287'000'000 + kLibraries;
}

int64_t cublasWorkspaceBytes(const GpuPreset& preset) {
    return preset.computeCapability >= 90 ? 32 * MiB : 2 * 4096 * 1024 + 8 * 16 * 1024;  // ":4096:2:16:8"
}

}  // namespace batchpilot::core
