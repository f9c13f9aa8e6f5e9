#include "core/cuda_meter.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <utility>

#include "core/byte_size.h"

namespace batchpilot::core {
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
// Index of the "all pools" entry in the allocator's StatArrays.
constexpr size_t kAggregate = 0;

class CudaMeter final : public MemoryMeter {
public:
    explicit CudaMeter(int index) : m_index(index) {}

    int64_t allocated() const override { return stats().allocated_bytes[kAggregate].current; }
    int64_t reserved() const override { return stats().reserved_bytes[kAggregate].current; }
    int64_t peak() const override { return stats().allocated_bytes[kAggregate].peak; }
    void resetPeak() override { alloc::resetPeakStats(m_index); }
    int64_t capacity() const override {
        // What this process can use: the driver's free memory plus what the cache already holds.
        return driverFree() + reserved();
    }
    int64_t free() const override { return std::max<int64_t>(0, capacity() - allocated()); }
    int64_t total() const override { return driverInfo().second; }
    int64_t otherProcesses() const override {
        const auto [freeBytes, totalBytes] = driverInfo();
        return std::max<int64_t>(0, totalBytes - freeBytes - reserved());
    }
    void releaseCache() override { alloc::emptyCache(); }

private:
    alloc::DeviceStats stats() const { return alloc::getDeviceStats(m_index); }
    int64_t driverFree() const { return driverInfo().first; }
    /// The driver's free and total bytes of the device (0, 0 when it cannot tell).
    std::pair<int64_t, int64_t> driverInfo() const {
        size_t freeBytes = 0;
        size_t totalBytes = 0;
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(m_index));
        if (cudaMemGetInfo(&freeBytes, &totalBytes) != cudaSuccess) {
            return {0, 0};
        }
        return {static_cast<int64_t>(freeBytes), static_cast<int64_t>(totalBytes)};
    }
    int m_index;
};

}  // namespace

std::unique_ptr<MemoryMeter> openCudaMeter(int index) { return std::make_unique<CudaMeter>(index); }

DeviceInfo describeCudaDevice(int index) {
    cudaDeviceProp properties{};
    cudaGetDeviceProperties(&properties, index);
    const auto total = static_cast<int64_t>(properties.totalGlobalMem);
    return {"cuda:" + std::to_string(index),
            std::string(properties.name) + ", " + formatBytes(total), total};
}

}  // namespace batchpilot::core
