#include "core/config/device_spec.h"

#include <charconv>

#include "core/base/byte_size.h"

namespace batchpilot::core {

std::string DeviceSpec::name() const {
    switch (kind) {
    case DeviceKind::Cpu: return "cpu";
    case DeviceKind::Cuda: return "cuda:" + std::to_string(index);
    case DeviceKind::Virtual: {
        // Prefer an exact binary unit so the name parses back to the same budget.
        constexpr int64_t kMiB = 1024 * 1024;
        if (budgetBytes % (1024 * kMiB) == 0) return "virtual:" + std::to_string(budgetBytes / (1024 * kMiB)) + "GiB";
        if (budgetBytes % kMiB == 0) return "virtual:" + std::to_string(budgetBytes / kMiB) + "MiB";
        if (budgetBytes % 1024 == 0) return "virtual:" + std::to_string(budgetBytes / 1024) + "KiB";
        return "virtual:" + std::to_string(budgetBytes);
    }
    }
    return "unknown";
}

tl::expected<DeviceSpec, std::string> parseDeviceName(std::string_view text) {
    const std::string name(text);
    if (name == "cpu") return DeviceSpec{DeviceKind::Cpu, 0, 0};
    if (name.rfind("virtual", 0) == 0) {
        if (name.size() <= 8 || name[7] != ':') {
            return tl::unexpected("device \"" + name +
                                  "\" needs a memory budget: write virtual:<size>, e.g. virtual:512MiB");
        }
        auto budget = parseByteSize(std::string_view(name).substr(8));
        if (!budget) return tl::unexpected("device \"" + name + "\": " + budget.error());
        return DeviceSpec{DeviceKind::Virtual, 0, *budget};
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
        return DeviceSpec{DeviceKind::Cuda, index, 0};
    }
    return tl::unexpected("unknown device \"" + name + "\": " + kDeviceForms);
}

}  // namespace batchpilot::core
