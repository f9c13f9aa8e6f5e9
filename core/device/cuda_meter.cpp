#include "core/device/cuda_meter.h"

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/base/byte_size.h"
#include "core/device/torch_compat.h"

namespace batchpilot::core {
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
// The allocator's statistics type (its namespace moved between LibTorch versions).
using DeviceStats = decltype(alloc::getDeviceStats(c10::DeviceIndex{0}));
// Index of the "all pools" entry in the allocator's StatArrays.
constexpr size_t kAggregate = 0;

/// The fraction each device was capped to (setCudaMemoryFraction), 0 when not capped.
std::mutex g_fractionMutex;
std::map<int, double> g_fractions;

double fractionOf(int index) {
    std::lock_guard lock(g_fractionMutex);
    const auto found = g_fractions.find(index);
    return found == g_fractions.end() ? 0.0 : found->second;
}

/// Initialises LibTorch's CUDA state, its caching allocator included, as the first CUDA tensor
/// would: the allocator's statistics, peak reset and memory fraction throw ("Invalid device
/// argument", "Allocator not initialized") when called before it. Python's torch does this in
/// torch.cuda._lazy_init(); a C++ program that reads the allocator before its first CUDA tensor
/// must do it itself (found on the first real GPU: every cuda:0 run failed at step 1).
template <typename Context>
void initializeCudaOf(Context& context) {
    // LibTorch 2.x: lazyInitDevice(type); 1.13 (Debian's): lazyInitCUDA().
    if constexpr (requires(Context & c) { c.lazyInitDevice(c10::DeviceType::CUDA); })
        context.lazyInitDevice(c10::DeviceType::CUDA);
    else
        context.lazyInitCUDA();
}

void initializeCuda() {
    initializeCudaOf(at::globalContext());
}

/// The segments of `snapshot` on device `index`, in address order, as the segment view takes them.
/// LibTorch 2.x returns a SnapshotInfo with the segments in it; older ones the segments themselves.
template <typename Snapshot>
std::vector<SegmentView> segmentsOf(const Snapshot& snapshot, int index) {
    const auto& all = [&]() -> const auto& {
        if constexpr (requires { snapshot.segments; })
            return snapshot.segments;
        else
            return snapshot;
    }
    ();
    std::vector<SegmentView> views;
    for (const auto& segment : all) {
        if (static_cast<int>(segment.device) != index) continue;
        SegmentView view;
        view.address = static_cast<int64_t>(segment.address);
        view.bytes = static_cast<int64_t>(segment.total_size);
        view.smallPool = !segment.is_large;
        if constexpr (requires { segment.is_expandable; }) view.expandable = segment.is_expandable;
        int64_t offset = 0;
        for (const auto& block : segment.blocks) {
            BlockView b;
            b.offset = offset;
            b.bytes = static_cast<int64_t>(block.size);
            b.allocated = block.allocated;
            if constexpr (requires { block.requested_size; })
                b.requestedBytes = block.allocated ? static_cast<int64_t>(block.requested_size) : 0;
            else
                b.requestedBytes = block.allocated ? b.bytes : 0;
            offset += b.bytes;
            view.blocks.push_back(b);
        }
        views.push_back(std::move(view));
    }
    std::sort(views.begin(), views.end(),
              [](const SegmentView& a, const SegmentView& b) { return a.address < b.address; });
    return views;
}

/// The allocator's OOMs as its out-of-memory observer saw them, per device: how many, and the
/// segments at the latest, read inside the allocator's OOM path (PyTorch calls its observers
/// after releasing its lock and before it raises, while the failed micro-batch's tensors still
/// hold their blocks; by the time the trainer hears of the OOM they are freed).
std::mutex g_oomMutex;
std::map<int, AllocatorFailureView> g_ooms;

void attachOomObserver() {
#if BATCHPILOT_CUDA_HAS_OOM_OBSERVER
    static std::once_flag g_observerAttached;
    std::call_once(g_observerAttached, [] {
        // Called with the device, the size it tried to reserve, the limit (the device's total, or
        // what set_per_process_memory_fraction allows) and the driver's free bytes; their types
        // differ between LibTorch versions (int64_t or size_t): a generic lambda takes either.
        alloc::attachOutOfMemoryObserver([](auto device, auto tried, auto limit, auto /*deviceFree*/) {
            const int index = static_cast<int>(device);
            AllocatorFailureView view;
            view.segments = segmentsOf(alloc::snapshot(), index);
            view.failure.segmentBytes = static_cast<int64_t>(tried);
            view.failure.limitBytes = static_cast<int64_t>(limit);
            for (const SegmentView& segment : view.segments) {
                view.failure.reservedBytes += segment.bytes;
                for (const BlockView& block : segment.blocks)
                    if (block.allocated) view.failure.allocatedBytes += block.bytes;
            }
            std::lock_guard lock(g_oomMutex);
            view.number = g_ooms[index].number + 1;
            g_ooms[index] = std::move(view);
        });
    });
#endif  // LibTorch 1.13: no observer; an OOM then has no snapshot of its own
}

class CudaMeter final : public MemoryMeter {
public:
    explicit CudaMeter(int index) : m_index(index) {
        initializeCuda();
        attachOomObserver();
    }

    int64_t allocated() const override { return stats().allocated_bytes[kAggregate].current; }
    int64_t reserved() const override { return stats().reserved_bytes[kAggregate].current; }
    int64_t peak() const override { return stats().allocated_bytes[kAggregate].peak; }
    int64_t peakReserved() const override { return stats().reserved_bytes[kAggregate].peak; }
    int64_t allocatorRetries() const override { return stats().num_alloc_retries; }
    int64_t allocatorOoms() const override { return stats().num_ooms; }
    void resetPeak() override { alloc::resetPeakStats(static_cast<c10::DeviceIndex>(m_index)); }
    int64_t capacity() const override {
        // What this process can use: the driver's free memory plus what the cache already holds,
        // or less where the allocator was capped to a fraction of the device.
        const int64_t reachable = driverFree() + reserved();
        const double fraction = fractionOf(m_index);
        if (fraction <= 0.0) return reachable;
        return std::min(reachable, static_cast<int64_t>(fraction * static_cast<double>(total())));
    }
    int64_t free() const override { return std::max<int64_t>(0, capacity() - allocated()); }
    int64_t total() const override { return driverInfo().second; }
    int64_t otherProcesses() const override {
        const auto [freeBytes, totalBytes] = driverInfo();
        return std::max<int64_t>(0, totalBytes - freeBytes - reserved());
    }
    void releaseCache() override { alloc::emptyCache(); }
    /// PyTorch's allocator's own segments (torch.cuda.memory_snapshot()). Not at an OOM: by the
    /// time the trainer hears of one, the failed micro-batch's tensors are freed.
    std::vector<SegmentView> segments() const override { return segmentsOf(alloc::snapshot(), m_index); }
    /// The latest OOM the allocator's observer saw on this device, with its segments then.
    AllocatorFailureView lastAllocatorFailure() const override {
        std::lock_guard lock(g_oomMutex);
        const auto found = g_ooms.find(m_index);
        return found == g_ooms.end() ? AllocatorFailureView{} : found->second;
    }

private:
    DeviceStats stats() const { return alloc::getDeviceStats(static_cast<c10::DeviceIndex>(m_index)); }
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

std::unique_ptr<MemoryMeter> openCudaMeter(int index) {
    return std::make_unique<CudaMeter>(index);
}

void setCudaMemoryFraction(int index, double fraction) {
    initializeCuda();
    alloc::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(index));
    std::lock_guard lock(g_fractionMutex);
    g_fractions[index] = fraction;
}

DeviceInfo describeCudaDevice(int index) {
    cudaDeviceProp properties{};
    cudaGetDeviceProperties(&properties, index);
    const auto total = static_cast<int64_t>(properties.totalGlobalMem);
    return {"cuda:" + std::to_string(index), std::string(properties.name) + ", " + formatBytes(total), total};
}

}  // namespace batchpilot::core
