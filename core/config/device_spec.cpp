#include "core/config/device_spec.h"

#include <cctype>
#include <charconv>
#include <cstdlib>

#include "core/base/byte_size.h"
#include "core/base/text_format.h"

namespace batchpilot::core {

std::string DeviceSpec::name() const {
    switch (kind) {
    case DeviceKind::Cpu: return "cpu";
    case DeviceKind::Cuda: return "cuda:" + std::to_string(index);
    case DeviceKind::Virtual: {
        // Prefer an exact binary unit so the name parses back to the same budget.
        constexpr int64_t kMiB = 1024 * 1024;
        std::string out;
        if (!preset.empty()) {
            out = "virtual:" + preset;
        } else if (budgetBytes % (1024 * kMiB) == 0) {
            out = "virtual:" + std::to_string(budgetBytes / (1024 * kMiB)) + "GiB";
        } else if (budgetBytes % kMiB == 0) {
            out = "virtual:" + std::to_string(budgetBytes / kMiB) + "MiB";
        } else if (budgetBytes % 1024 == 0) {
            out = "virtual:" + std::to_string(budgetBytes / 1024) + "KiB";
        } else {
            out = "virtual:" + std::to_string(budgetBytes);
        }
        if (allocator) {
            std::string settings = allocator->text();
            for (char& c : settings) c = c == ',' ? '/' : c;
            out += "/" + (settings.empty() ? std::string("caching") : settings);
        }
        return out;
    }
    }
    return "unknown";
}

tl::expected<DeviceSpec, std::string> parseDeviceName(std::string_view text) {
    const std::string name(text);
    if (name == "cpu") return DeviceSpec{DeviceKind::Cpu, 0, 0, std::nullopt, {}};
    if (name.rfind("virtual", 0) == 0) {
        if (name.size() <= 8 || name[7] != ':') {
            return tl::unexpected("device \"" + name +
                                  "\" needs a memory budget: write virtual:<size>, e.g. virtual:512MiB");
        }
        const auto slash = name.find('/');
        const std::string_view size =
            std::string_view(name).substr(8, slash == std::string::npos ? std::string::npos : slash - 8);
        DeviceSpec spec{DeviceKind::Virtual, 0, 0, std::nullopt, {}};
        if (const GpuPreset* gpu = findGpuPreset(size)) {
            spec.budgetBytes = gpu->capacityBytes;
            spec.preset = std::string(gpu->name);
        } else {
            auto budget = parseByteSize(size);
            if (!budget) {
                const bool named = !size.empty() && std::isalpha(static_cast<unsigned char>(size.front()));
                return tl::unexpected(
                    "device \"" + name + "\": " +
                    (named ? "\"" + cutForMessage(std::string(size)) +
                                 "\" is neither a memory size (e.g. virtual:512MiB) nor a GPU preset (" +
                                 gpuPresetNames() + ")"
                           : budget.error()));
            }
            spec.budgetBytes = *budget;
        }
        if (slash != std::string::npos) {
            auto settings = parseAllocatorSettings(std::string_view(name).substr(slash + 1), {}, '/');
            if (!settings) return tl::unexpected("device \"" + name + "\": " + settings.error());
            spec.allocator = *settings;
        }
        return spec;
    }
    if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
        int index = 0;
        if (name.size() > 5) {
            const char* first = name.data() + 5;
            const char* last = name.data() + name.size();
            const auto [end, ec] = std::from_chars(first, last, index);
            if (ec != std::errc{} || end != last || index < 0) {
                return tl::unexpected("device \"" + name + "\": the CUDA index must be a number, e.g. cuda:0");
            }
        }
        return DeviceSpec{DeviceKind::Cuda, index, 0, std::nullopt, {}};
    }
    return tl::unexpected("unknown device \"" + name + "\": " + kDeviceForms);
}

bool expandableSegmentsOn(const DeviceSpec& device) {
    const auto settings = virtualAllocatorSettings(device);
    return settings && settings->expandableSegments;
}

tl::expected<AllocatorSettings, std::string> virtualAllocatorSettings(const DeviceSpec& device,
                                                                      std::vector<std::string>* ignored) {
    if (device.allocator) return *device.allocator;
    for (const char* variable : {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"}) {
        const char* value = std::getenv(variable);
        if (value == nullptr || *value == '\0') continue;
        auto settings = parseAllocatorSettings(value, {}, ',', ignored);
        if (!settings) return tl::unexpected(std::string(variable) + ": " + settings.error());
        return settings;
    }
    // A virtual GPU is a GPU's memory: PyTorch's caching allocator with its defaults, for a preset
    // and a bare budget alike. Exact byte counting is asked for by name (virtual:64MiB/exact).
    return AllocatorSettings{};
}

}  // namespace batchpilot::core
