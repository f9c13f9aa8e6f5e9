#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

#include "core/memory/caching_allocator.h"
#include "core/memory/gpu_presets.h"

namespace batchpilot::core {

/// Device names as the user writes them, without asking the machine what it has (that is
/// parseDevice() in device.h, which also checks that a CUDA device exists).
enum class DeviceKind { Cpu, Cuda, Virtual };

/// A parsed device name: "cpu", "cuda:N" or "virtual:<size>[/<allocator setting>...]".
struct DeviceSpec {
    DeviceKind kind = DeviceKind::Cpu;
    int index = 0;            ///< CUDA device index
    int64_t budgetBytes = 0;  ///< virtual devices only
    /// Virtual devices: the allocator settings the name gives ("virtual:8GiB/caching",
    /// "virtual:8GiB/expandable_segments:True", "virtual:64MiB/exact"); none: the environment's
    /// PYTORCH_ALLOC_CONF, else exact counting.
    std::optional<AllocatorSettings> allocator;
    /// Virtual devices named after a GPU ("virtual:T4"): the preset's name; its capacity is
    /// budgetBytes. Empty for "virtual:<size>".
    std::string preset;

    /// Canonical name ("cpu", "cuda:0", "virtual:512MiB", "virtual:1GiB/exact").
    std::string name() const;
};

/// The forms a device name may take, for messages.
inline constexpr const char* kDeviceForms =
    "use cpu, cuda:N or virtual:<size> (a simulated GPU behind PyTorch's caching allocator, e.g. virtual:512MiB; "
    "virtual:512MiB/exact counts bytes instead)";

/// The allocator settings a virtual device uses: its name's, else the environment's
/// (PYTORCH_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF, as PyTorch reads them), else the caching
/// allocator's defaults. For a CUDA device, the environment's: what PyTorch itself uses.
/// `ignored` receives PyTorch options the model does not simulate; an error names the variable.
tl::expected<AllocatorSettings, std::string> virtualAllocatorSettings(const DeviceSpec& device,
                                                                      std::vector<std::string>* ignored = nullptr);

/// Whether the device's allocator runs with expandable_segments:True (virtualAllocatorSettings);
/// false where the settings do not parse.
bool expandableSegmentsOn(const DeviceSpec& device);

/// Parses a device name's syntax only. Messages say what was wrong and list the valid forms.
tl::expected<DeviceSpec, std::string> parseDeviceName(std::string_view text);

}  // namespace batchpilot::core
