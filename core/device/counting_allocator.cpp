#include "core/device/counting_allocator.h"

#include <mutex>
#include <string>
#include <type_traits>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include "core/base/byte_size.h"
#include "core/base/host_memory.h"

namespace batchpilot::core {
namespace {

// Keeps the data 64-byte aligned, as alloc_cpu's blocks are.
constexpr size_t kBlockHeaderBytes = 64;

struct Header {
    int64_t bytes;
    int64_t address;  ///< the block in the allocator model
    int32_t model;    ///< which model (CountingAllocator::m_models)
    bool counted;
};
static_assert(sizeof(Header) <= kBlockHeaderBytes);

thread_local bool t_counting = false;

Header* headerOf(void* data) {
    return reinterpret_cast<Header*>(static_cast<char*>(data) - kBlockHeaderBytes);
}

}  // namespace

CountingAllocator& CountingAllocator::instance() {
    // Never destroyed: tensors may be freed during the process's exit, after static destructors.
    static CountingAllocator* allocator = new CountingAllocator();
    return *allocator;
}

CountingAllocator::CountingAllocator() {
    AllocatorSettings exact;
    exact.exact = true;
    m_models.push_back(std::make_unique<CachingAllocatorModel>(exact, 0));
}

template <typename Change>
auto CountingAllocator::changeModel(CachingAllocatorModel& model, Change change) {
    const AllocatorStats before = model.stats();
    const auto publish = [&] {
        const AllocatorStats& after = model.stats();
        const int64_t allocated = m_allocated.load() + after.allocatedBytes - before.allocatedBytes;
        const int64_t reserved = m_reserved.load() + after.reservedBytes - before.reservedBytes;
        m_allocated.store(allocated);
        m_reserved.store(reserved);
        m_allocRetries.fetch_add(after.allocRetries - before.allocRetries);
        if (allocated > m_peak.load()) m_peak.store(allocated);
        if (reserved > m_peakReserved.load()) m_peakReserved.store(reserved);
    };
    if constexpr (std::is_void_v<decltype(change())>) {
        change();
        publish();
    } else {
        auto result = change();
        publish();
        return result;
    }
}

void CountingAllocator::configure(int64_t budget, const AllocatorSettings& settings, int64_t workspaceBytes) {
    std::lock_guard lock(m_mutex);
    m_budget.store(budget);
    if (m_workspaceBytes.load() > 0) {
        CachingAllocatorModel& holder = *m_models[m_workspaceModel];
        changeModel(holder, [&] { holder.free(m_workspaceAddress); });
        m_workspaceBytes.store(0);
    }
    CachingAllocatorModel& current = *m_models.back();
    changeModel(current, [&] { current.emptyCache(); });
    if (current.settings() == settings) {
        current.setLimit(budget);
    } else {
        // The old model keeps the blocks still alive (they are released into it); the budget now
        // applies to the new one, which holds nothing yet.
        current.setLimit(0);
        m_models.push_back(std::make_unique<CachingAllocatorModel>(settings, budget));
    }
    if (workspaceBytes > 0) {
        CachingAllocatorModel& model = *m_models.back();
        if (auto placed = changeModel(model, [&] { return model.allocate(workspaceBytes); })) {
            m_workspaceAddress = *placed;
            m_workspaceModel = m_models.size() - 1;
            m_workspaceBytes.store(workspaceBytes);
        }
    }
}

void CountingAllocator::setBudget(int64_t bytes) {
    std::lock_guard lock(m_mutex);
    m_budget.store(bytes);
    m_models.back()->setLimit(bytes);
}

void CountingAllocator::resetPeak() {
    m_peak.store(m_allocated.load());
    m_peakReserved.store(m_reserved.load());
}

void CountingAllocator::emptyCache() {
    std::lock_guard lock(m_mutex);
    for (auto& model : m_models) changeModel(*model, [&] { model->emptyCache(); });
}

AllocationFailure CountingAllocator::lastFailure() const {
    std::lock_guard lock(m_mutex);
    return m_lastFailure;
}

std::vector<SegmentView> CountingAllocator::segments() const {
    std::lock_guard lock(m_mutex);
    return m_models.empty() ? std::vector<SegmentView>{} : m_models.back()->segments();
}

std::vector<SegmentView> CountingAllocator::segmentsAtLastFailure() const {
    std::lock_guard lock(m_mutex);
    return m_segmentsAtFailure;
}

bool CountingAllocator::exact() const {
    std::lock_guard lock(m_mutex);
    return m_models.empty() || m_models.back()->settings().exact;
}

c10::DataPtr CountingAllocator::allocate(size_t bytes) BATCHPILOT_ALLOCATE_CONST {
    const auto size = static_cast<int64_t>(bytes);
    const bool counted = t_counting;
    int64_t address = 0;
    int32_t modelIndex = 0;
    if (counted) {
        const int64_t number = m_count.fetch_add(1) + 1;
        int64_t failAt = m_failAt.load();
        const bool injected = failAt != 0 && number >= failAt && m_failAt.compare_exchange_strong(failAt, 0);
        auto* self = const_cast<CountingAllocator*>(this);
        std::string message;
        bool driverError = false;  // expandable segments: the driver's error, not OutOfMemoryError
        {
            std::lock_guard lock(m_mutex);
            CachingAllocatorModel& model = *self->m_models.back();
            modelIndex = static_cast<int32_t>(self->m_models.size() - 1);
            const int64_t before = m_allocated.load();
            if (injected) {
                m_lastFailed.store(size);
                m_allocatedAtFailure.store(before);
                message = "virtual GPU out of memory: tried to allocate " + formatBytes(size) + " with " +
                          formatBytes(before) + " allocated (injected failure at counted allocation " +
                          std::to_string(number) + ")";
            } else {
                auto placed = self->changeModel(model, [&] { return model.allocate(size); });
                if (placed) {
                    address = *placed;
                } else {
                    const AllocationFailure& failure = placed.error();
                    self->m_lastFailure = failure;
                    self->m_segmentsAtFailure = model.segments();  // only at an OOM: its cost is the copy
                    self->m_failures.fetch_add(1);
                    m_lastFailed.store(size);
                    m_allocatedAtFailure.store(failure.allocatedBytes);
                    if (model.settings().exact) {
                        message = "virtual GPU out of memory: tried to allocate " + formatBytes(size) + " with " +
                                  formatBytes(before) + " allocated of a " + formatBytes(failure.limitBytes) +
                                  " budget";
                    } else if (model.settings().expandableSegments) {
                        // With expandable segments a failed mapping can surface as the driver's
                        // error rather than as OutOfMemoryError; BatchPilot must recognise both.
                        message = "CUDA driver error: out of memory (" + cudaOutOfMemoryText(failure) + ")";
                        driverError = true;
                    } else {
                        message = cudaOutOfMemoryText(failure);
                    }
                }
            }
        }
        if (!message.empty()) {
            if (driverError) C10_THROW_ERROR(Error, message);
            C10_THROW_ERROR(OutOfMemoryError, message);
        }
        m_countedBytes.fetch_add(size);
    }
    void* base = nullptr;
    try {
        base = c10::alloc_cpu(bytes + kBlockHeaderBytes);
    } catch (...) {
        // The host itself is out of memory: give the block back, then let the caller classify it.
        if (counted) {
            auto* self = const_cast<CountingAllocator*>(this);
            std::lock_guard lock(m_mutex);
            CachingAllocatorModel& model = *self->m_models[modelIndex];
            self->changeModel(model, [&] { model.free(address); });
        }
        throw;
    }
    auto* header = static_cast<Header*>(base);
    header->bytes = size;
    header->address = address;
    header->model = modelIndex;
    header->counted = counted;
    void* data = static_cast<char*>(base) + kBlockHeaderBytes;
    return {data, data, &CountingAllocator::release, c10::Device(c10::DeviceType::CPU)};
}

void CountingAllocator::release(void* data) {
    if (data == nullptr) {
        return;
    }
    Header* header = headerOf(data);
    if (header->counted) {
        CountingAllocator& self = instance();
        std::lock_guard lock(self.m_mutex);
        CachingAllocatorModel& model = *self.m_models[header->model];
        self.changeModel(model, [&] { model.free(header->address); });
    }
    c10::free_cpu(header);
}

int64_t CountingAllocator::blockBytes(const c10::DataPtr& data) {
    if (data.get() == nullptr || data.get_deleter() != &CountingAllocator::release) return -1;
    return headerOf(data.get())->bytes;
}

c10::DeleterFnPtr CountingAllocator::raw_deleter() const {
    return &CountingAllocator::release;
}

#if BATCHPILOT_ALLOCATOR_HAS_COPY_DATA
void CountingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
    default_copy_data(dest, src, count);
}
#endif

void installCountingAllocator() {
    static std::once_flag once;
    std::call_once(once, [] {
        keepFreedHostMemory();
        c10::SetCPUAllocator(&CountingAllocator::instance(), /*priority=*/100);
    });
}

CountingScope::CountingScope(bool counting) : m_previous(t_counting) {
    t_counting = counting;
}

CountingScope::~CountingScope() {
    t_counting = m_previous;
}

bool CountingScope::active() {
    return t_counting;
}

}  // namespace batchpilot::core
