#pragma once

#include <atomic>
#include <cstdint>

#include <c10/core/Allocator.h>

#include "core/device/torch_compat.h"

namespace batchpilot::core {

/// The CPU allocator BatchPilot installs with c10::SetCPUAllocator. It counts the bytes allocated
/// by threads inside a CountingScope (the trainer thread), keeps a resettable peak, and enforces
/// an optional budget by throwing c10::OutOfMemoryError — the type a CUDA OOM throws — which is
/// how a "virtual GPU" behaves like a real one. Tests can make the N-th counted allocation fail.
///
/// Every block carries a 64-byte header with its size and whether it was counted, so a block is
/// uncounted correctly whichever thread frees it. The DataPtr's context is the data pointer
/// itself, as ATen's raw_allocate requires.
///
/// Thread rules: all methods are thread-safe.
class CountingAllocator final : public c10::Allocator {
public:
    /// The process-wide instance, installed as the CPU allocator on first use.
    static CountingAllocator& instance();

    c10::DataPtr allocate(size_t bytes) BATCHPILOT_ALLOCATE_CONST override;
    c10::DeleterFnPtr raw_deleter() const override;
#if BATCHPILOT_ALLOCATOR_HAS_COPY_DATA
    void copy_data(void* dest, const void* src, std::size_t count) const override;
#endif

    /// The size asked for when `data` was allocated by this allocator; -1 for memory from
    /// elsewhere. Lets a loader compare what a file claims with what it read (a TorchScript
    /// file's storages are allocated here at their record's size).
    static int64_t blockBytes(const c10::DataPtr& data);

    /// Counted bytes may not exceed `bytes`; 0 removes the budget.
    void setBudget(int64_t bytes) {
        m_budget.store(bytes);
    }
    int64_t budget() const {
        return m_budget.load();
    }
    /// Bytes currently allocated by counting threads.
    int64_t allocated() const {
        return m_allocated.load();
    }
    /// Highest allocated() since the last resetPeak().
    int64_t peak() const {
        return m_peak.load();
    }
    void resetPeak() {
        m_peak.store(m_allocated.load());
    }
    /// Bytes of all successful counted allocations since start-up (never decreases).
    int64_t countedBytes() const {
        return m_countedBytes.load();
    }
    /// Number of counted allocations since start-up (successful or not).
    int64_t countedAllocations() const {
        return m_count.load();
    }
    /// Makes the `n`-th counted allocation from now fail with an OOM (once); 0 cancels.
    void failAfter(int64_t n) {
        m_failAt.store(n > 0 ? m_count.load() + n : 0);
    }
    /// Size of the most recent allocation that failed, 0 when none did.
    int64_t lastFailedRequest() const {
        return m_lastFailed.load();
    }
    /// Bytes allocated when that allocation failed.
    int64_t allocatedAtLastFailure() const {
        return m_allocatedAtFailure.load();
    }

private:
    CountingAllocator() = default;
    static void release(void* data);

    mutable std::atomic<int64_t> m_allocated{0};
    mutable std::atomic<int64_t> m_peak{0};
    mutable std::atomic<int64_t> m_count{0};
    mutable std::atomic<int64_t> m_countedBytes{0};
    mutable std::atomic<int64_t> m_failAt{0};
    mutable std::atomic<int64_t> m_lastFailed{0};
    mutable std::atomic<int64_t> m_allocatedAtFailure{0};
    std::atomic<int64_t> m_budget{0};
};

/// Installs CountingAllocator as LibTorch's CPU allocator (idempotent). Call at start-up, before
/// tensors are created; tensors made earlier keep their own deleters and stay valid.
void installCountingAllocator();

/// While alive, allocations made by the current thread are counted (or, with `counting` false,
/// not counted). Scopes nest and restore the previous setting.
class CountingScope {
public:
    explicit CountingScope(bool counting = true);
    ~CountingScope();
    CountingScope(const CountingScope&) = delete;
    CountingScope& operator=(const CountingScope&) = delete;

    /// Whether the current thread is counting.
    static bool active();

private:
    bool m_previous;
};

}  // namespace batchpilot::core
