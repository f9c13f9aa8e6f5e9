#include "core/device/device.h"

#include <fstream>
#include <sstream>

#include <torch/cuda.h>

#include "core/base/byte_size.h"
#include "core/device/counting_allocator.h"
#include "core/device/cuda_meter.h"

namespace batchpilot::core {
namespace {

/// MemAvailable from /proc/meminfo in bytes, 0 when unreadable.
int64_t hostAvailableBytes() {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    int64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit) {
        if (key == "MemAvailable:") {
            return kib * 1024;
        }
    }
    return 0;
}

/// Meter over the counting allocator: the CPU (capacity = available host memory) or a virtual
/// GPU (capacity = its budget).
class CountingMeter final : public MemoryMeter {
public:
    explicit CountingMeter(int64_t budget) : m_budget(budget) {
        CountingAllocator::instance().setBudget(budget);
        m_capacity = budget > 0 ? budget : allocated() + hostAvailableBytes();
    }
    int64_t allocated() const override { return CountingAllocator::instance().allocated(); }
    int64_t reserved() const override { return allocated(); }
    int64_t peak() const override { return CountingAllocator::instance().peak(); }
    void resetPeak() override { CountingAllocator::instance().resetPeak(); }
    int64_t capacity() const override { return m_capacity; }
    int64_t free() const override { return std::max<int64_t>(0, m_capacity - allocated()); }
    int64_t lastFailedAllocation() const override { return CountingAllocator::instance().lastFailedRequest(); }
    int64_t lastFailureNeed() const override {
        const auto& allocator = CountingAllocator::instance();
        return allocator.allocatedAtLastFailure() + allocator.lastFailedRequest();
    }

private:
    int64_t m_budget;
    int64_t m_capacity;
};

}  // namespace

bool cudaAvailable() {
    return torch::cuda::is_available();
}

tl::expected<DeviceSpec, std::string> parseDevice(std::string_view text) {
    auto spec = parseDeviceName(text);
    if (!spec || spec->kind != DeviceKind::Cuda) return spec;
    const std::string name(text);
    if (!cudaAvailable()) {
        return tl::unexpected("device \"" + name + "\" does not exist: this build has no usable CUDA device; " +
                              kDeviceForms);
    }
    const auto count = static_cast<int>(torch::cuda::device_count());
    if (spec->index >= count) {
        return tl::unexpected("device \"" + name + "\" does not exist: this machine has " + std::to_string(count) +
                              " CUDA device(s), cuda:0 to cuda:" + std::to_string(count - 1));
    }
    return spec;
}

std::vector<DeviceInfo> availableDevices() {
    std::vector<DeviceInfo> devices;
    const int64_t host = hostAvailableBytes();
    devices.push_back({"cpu", "host memory, " + formatBytes(host) + " available", host});
    if (cudaAvailable()) {
        for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i) {
            devices.push_back(describeCudaDevice(i));
        }
    }
    return devices;
}

std::unique_ptr<MemoryMeter> openMeter(const DeviceSpec& device) {
    switch (device.kind) {
    case DeviceKind::Cpu: return std::make_unique<CountingMeter>(0);
    case DeviceKind::Virtual: return std::make_unique<CountingMeter>(device.budgetBytes);
    case DeviceKind::Cuda: CountingAllocator::instance().setBudget(0); return openCudaMeter(device.index);
    }
    return nullptr;
}

}  // namespace batchpilot::core
