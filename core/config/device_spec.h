#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

namespace batchpilot::core {

/// Device names as the user writes them, without asking the machine what it has (that is
/// parseDevice() in device.h, which also checks that a CUDA device exists).
enum class DeviceKind { Cpu, Cuda, Virtual };

/// A parsed device name: "cpu", "cuda:N" or "virtual:<size>".
struct DeviceSpec {
    DeviceKind kind = DeviceKind::Cpu;
    int index = 0;            ///< CUDA device index
    int64_t budgetBytes = 0;  ///< virtual devices only

    /// Canonical name ("cpu", "cuda:0", "virtual:512MiB").
    std::string name() const;
};

/// The forms a device name may take, for messages.
inline constexpr const char* kDeviceForms = "use cpu, cuda:N or virtual:<size> (a simulated GPU, e.g. virtual:512MiB)";

/// Parses a device name's syntax only. Messages say what was wrong and list the valid forms.
tl::expected<DeviceSpec, std::string> parseDeviceName(std::string_view text);

}  // namespace batchpilot::core
