#pragma once

// The GPUs people are handed, as virtual devices: `virtual:T4`, `virtual:A100-80GB`, …
// Each with the memory PyTorch reports for it (cudaMemGetInfo's total, what "GPU 0 has a total
// capacity of …" says) and its compute capability, which sets the cuBLAS workspace size. One
// table, gpu_presets.cpp, with where each number comes from.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace batchpilot::core {

struct GpuPreset {
    std::string_view name;         ///< as written after "virtual:" ("T4", "A100-80GB")
    std::string_view description;  ///< "NVIDIA A100 80 GB (SXM4)"
    int64_t capacityBytes = 0;     ///< total device memory as PyTorch reports it
    int computeCapability = 0;     ///< major × 10 + minor (75 for 7.5)
    std::string_view source;       ///< where the capacity figure comes from
};

/// Every preset, in the order --list-devices shows them.
std::span<const GpuPreset> gpuPresets();

/// The preset named `name` (letters' case, '-' and '_' ignored: "a100_80gb" finds "A100-80GB");
/// nullptr when there is none.
const GpuPreset* findGpuPreset(std::string_view name);

/// The names of all presets, comma-separated, for messages.
std::string gpuPresetNames();

/// Memory a training process holds on the device outside PyTorch's allocator: the CUDA context
/// and the math libraries' kernels and handles (cuBLAS, cuDNN). Measured on an H200 (PyTorch 2.11,
/// CUDA 13.0, cuDNN 9.19, driver 580; scripts/gpu-check, docs/GPU.md): 527 MiB once the context
/// existed, 765 MiB after a convolution's and a linear layer's forward and backward — 238 MiB for
/// the libraries. Hopper presets (compute capability 9.x) take the H200's 765 MiB; the others the
/// 287 MB context PyTorch PR #86509 measured with lazy module loading, plus the same 238 MiB.
int64_t cudaContextBytes(const GpuPreset& preset);

/// The cuBLAS workspace PyTorch takes through its caching allocator at the first matrix product:
/// CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8", 2 × 4096 KiB + 8 × 16 KiB = 8,519,680 B, before compute
/// capability 9.0; 32 MiB from it
/// (H100, H200) (aten/src/ATen/cuda/CublasHandlePool.cpp, getChosenWorkspaceSize).
int64_t cublasWorkspaceBytes(const GpuPreset& preset);

}  // namespace batchpilot::core
