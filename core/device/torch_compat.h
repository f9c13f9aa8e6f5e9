#pragma once

// Where Debian's LibTorch 1.13 and the current LibTorch from PyPI (2.x) differ, and nowhere else.
// Every difference is one macro or one small function here, named for what it bridges.

#include <torch/version.h>

/// True for LibTorch from `major.minor` on.
#define BATCHPILOT_TORCH_AT_LEAST(major, minor) \
    (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// The CUDA caching allocator calls out-of-memory observers (attachOutOfMemoryObserver) from 2.0.
#define BATCHPILOT_CUDA_HAS_OOM_OBSERVER BATCHPILOT_TORCH_AT_LEAST(2, 0)

// c10::Allocator::allocate lost its const in 2.3, which also added the pure virtual copy_data.
#if BATCHPILOT_TORCH_AT_LEAST(2, 3)
#define BATCHPILOT_ALLOCATE_CONST
#define BATCHPILOT_ALLOCATOR_HAS_COPY_DATA 1
#else
#define BATCHPILOT_ALLOCATE_CONST const
#define BATCHPILOT_ALLOCATOR_HAS_COPY_DATA 0
#endif

#include <ATen/autocast_mode.h>

// GroupNorm and BatchNorm on the CPU take bfloat16 input with float32 weights (what bfloat16
// autocast gives them) from 2.1 on; 1.13 rejects the mix.
#define BATCHPILOT_NORMS_TAKE_MIXED_TYPES BATCHPILOT_TORCH_AT_LEAST(2, 1)

// float16 autocast on the CPU (the memory savers fp16 on cpu and virtual devices) from 2.5 on;
// 1.13's CPU autocast takes bfloat16 only. CUDA autocasts float16 in every version.
#define BATCHPILOT_CPU_AUTOCASTS_FLOAT16 BATCHPILOT_TORCH_AT_LEAST(2, 5)

namespace batchpilot::core {

/// Autocast's switch and type for one device type (CPU or CUDA): 2.4 made the API take the
/// device type, 1.13 has one function per device.
struct AutocastState {
    bool enabled = false;
    c10::ScalarType type = c10::ScalarType::BFloat16;

    static AutocastState current(c10::DeviceType device) {
#if BATCHPILOT_TORCH_AT_LEAST(2, 4)
        return {at::autocast::is_autocast_enabled(device), at::autocast::get_autocast_dtype(device)};
#else
        if (device == c10::DeviceType::CUDA)
            return {at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()};
        return {at::autocast::is_cpu_enabled(), at::autocast::get_autocast_cpu_dtype()};
#endif
    }
    void apply(c10::DeviceType device) const {
#if BATCHPILOT_TORCH_AT_LEAST(2, 4)
        at::autocast::set_autocast_dtype(device, type);
        at::autocast::set_autocast_enabled(device, enabled);
#else
        if (device == c10::DeviceType::CUDA) {
            at::autocast::set_autocast_gpu_dtype(type);
            at::autocast::set_enabled(enabled);
        } else {
            at::autocast::set_autocast_cpu_dtype(type);
            at::autocast::set_cpu_enabled(enabled);
        }
#endif
    }
};

/// Autocast as `state` says on `device` for its lifetime (like Python's torch.autocast), then
/// as before; leaving the outermost scope frees autocast's cache of weights cast to the low type.
class AutocastScope {
public:
    AutocastScope(c10::DeviceType device, AutocastState state)
        : m_device(device), m_before(AutocastState::current(device)) {
        state.apply(device);
        at::autocast::increment_nesting();
    }
    ~AutocastScope() {
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        m_before.apply(m_device);
    }
    AutocastScope(const AutocastScope&) = delete;
    AutocastScope& operator=(const AutocastScope&) = delete;

private:
    c10::DeviceType m_device;
    AutocastState m_before;
};

}  // namespace batchpilot::core
