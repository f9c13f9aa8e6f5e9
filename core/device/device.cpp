#include "core/device/device.h"

#include <fstream>
#include <sstream>

#include <torch/cuda.h>

#include "core/base/byte_size.h"
#include "core/base/host_memory.h"
#include "core/device/counting_allocator.h"
#include "core/device/cuda_meter.h"

namespace batchpilot::core {
namespace {

/// Meter over the counting allocator: the CPU (capacity = available host memory) or a virtual
/// GPU (capacity = its budget).
class CountingMeter final : public MemoryMeter {
public:
    /// `context`: of the budget, what a simulated CUDA context takes outside the allocator.
    CountingMeter(int64_t budget, const AllocatorSettings& settings, int64_t context = 0, int64_t workspace = 0)
        : m_context(context) {
        // A virtual GPU's tensors live in host memory: a budget beyond the machine's memory (or
        // its container's limit) can never be honoured (virtual:8000000TB, an H200 preset on a
        // laptop) and is held to it, less a margin for the rest of the process, so that the probe
        // meets a virtual OOM and not the kernel's OOM killer (it allocated until the machine ran
        // out). The machine's memory, not what is free now: the same budget means the same on a
        // busy machine as on an idle one.
        int64_t limit = budget - context;
        if (const int64_t host = hostMemoryBytes(); budget > 0 && host > 0) {
            const int64_t hostLimit = std::max<int64_t>(int64_t{64} << 20, host - kHostMargin);
            if (limit > hostLimit) {
                m_note = "the device's " + formatBytes(budget) + " is more than this machine's memory (" +
                         formatBytes(host) + "), where a virtual GPU keeps its tensors: it holds at most " +
                         formatBytes(hostLimit) + " here, and the micro-batch found is what fits in that";
                limit = hostLimit;
            }
        }
        CountingAllocator::instance().configure(limit, settings, workspace);
        m_capacity = budget > 0 ? limit : allocated() + hostAvailableBytes();
    }
    std::string limitNote() const override { return m_note; }
    int64_t total() const override { return m_capacity + m_context; }
    int64_t contextBytes() const override { return m_context; }
    int64_t workspaceBytes() const override { return CountingAllocator::instance().workspaceBytes(); }
    int64_t allocated() const override { return CountingAllocator::instance().allocated(); }
    int64_t reserved() const override { return CountingAllocator::instance().reserved(); }
    int64_t peak() const override { return CountingAllocator::instance().peak(); }
    int64_t peakReserved() const override { return CountingAllocator::instance().peakReserved(); }
    int64_t allocatorRetries() const override { return CountingAllocator::instance().allocRetries(); }
    int64_t allocatorOoms() const override { return CountingAllocator::instance().failures(); }
    void resetPeak() override { CountingAllocator::instance().resetPeak(); }
    void releaseCache() override { CountingAllocator::instance().emptyCache(); }
    int64_t capacity() const override { return m_capacity; }
    int64_t free() const override { return std::max<int64_t>(0, m_capacity - reserved()); }
    int64_t lastFailedAllocation() const override { return CountingAllocator::instance().lastFailedRequest(); }
    int64_t lastFailureNeed() const override {
        const auto& allocator = CountingAllocator::instance();
        return allocator.allocatedAtLastFailure() + allocator.lastFailedRequest();
    }
    std::vector<SegmentView> segments() const override {
        const auto& allocator = CountingAllocator::instance();
        return allocator.exact() ? std::vector<SegmentView>{} : allocator.segments();
    }
    AllocatorFailureView lastAllocatorFailure() const override {
        const auto& allocator = CountingAllocator::instance();
        if (allocator.exact()) return {};
        // The number first: a failure that lands between the reads is reported again, never lost.
        AllocatorFailureView view;
        view.number = allocator.failures();
        view.failure = allocator.lastFailure();
        view.segments = allocator.segmentsAtLastFailure();
        return view;
    }

private:
    /// Host memory left to the rest of the process (and the machine) under a virtual GPU held to
    /// the host's memory.
    static constexpr int64_t kHostMargin = int64_t{1} << 30;
    int64_t m_context = 0;
    int64_t m_capacity;
    std::string m_note;
};

}  // namespace

bool cudaAvailable() {
    return torch::cuda::is_available();
}

tl::expected<DeviceSpec, std::string> parseDevice(std::string_view text) {
    auto spec = parseDeviceName(text);
    if (spec && spec->kind == DeviceKind::Virtual) {
        // The environment's allocator settings apply to virtual devices as PyTorch applies them to
        // real ones: a mistake there is this machine's, said before anything runs.
        if (auto settings = virtualAllocatorSettings(*spec); !settings) {
            return tl::unexpected("device \"" + std::string(text) + "\": " + settings.error() +
                                  " (set it right or unset it, or give the device its own settings, e.g. " +
                                  "virtual:8GiB/expandable_segments:True)");
        }
    }
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
    case DeviceKind::Cpu: {
        AllocatorSettings exact;  // host memory: every byte asked for, nothing cached
        exact.exact = true;
        return std::make_unique<CountingMeter>(0, exact);
    }
    case DeviceKind::Virtual: {
        // Settings the environment gets wrong were refused where the device was chosen
        // (parseDevice); here they fall back to PyTorch's defaults.
        const AllocatorSettings settings = virtualAllocatorSettings(device).value_or(AllocatorSettings{});
        if (const GpuPreset* gpu = findGpuPreset(device.preset)) {
            return std::make_unique<CountingMeter>(device.budgetBytes, settings, cudaContextBytes(*gpu),
                                                   cublasWorkspaceBytes(*gpu));
        }
        return std::make_unique<CountingMeter>(device.budgetBytes, settings);
    }
    case DeviceKind::Cuda: CountingAllocator::instance().setBudget(0); return openCudaMeter(device.index);
    }
    return nullptr;
}

}  // namespace batchpilot::core
