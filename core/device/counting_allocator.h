#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <c10/core/Allocator.h>

#include "core/device/torch_compat.h"
#include "core/memory/caching_allocator.h"

namespace batchpilot::core {

/// The CPU allocator BatchPilot installs with c10::SetCPUAllocator. The bytes allocated by
/// threads inside a CountingScope (the trainer thread) go through a model of PyTorch's CUDA
/// caching allocator (core/memory/caching_allocator.h: blocks rounded, packed into segments,
/// cached when freed; the budget counts reserved segments; the cache is flushed and the
/// allocation retried before an OOM) — or, with the `exact` setting and on the CPU device,
/// through a plain byte count. The memory itself always comes from the host. Over the budget it
/// throws c10::OutOfMemoryError with CUDA's text, which is how a "virtual GPU" behaves like a
/// real one. Tests can make the N-th counted allocation fail.
///
/// Every block carries a 64-byte header with its size, its block in the model and whether it was
/// counted, so a block is released correctly whichever thread frees it. The DataPtr's context is
/// the data pointer itself, as ATen's raw_allocate requires.
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

    /// A device is opened: the budget (0: none) and the allocator's settings. The cache is
    /// emptied, as a new process's would be; blocks still alive are released into the model they
    /// came from.
    /// `workspaceBytes`: a block held for the device's lifetime, as cuBLAS's workspace is on a GPU
    /// (0: none); the previous device's is released.
    void configure(int64_t budget, const AllocatorSettings& settings, int64_t workspaceBytes = 0);
    /// The block configure() holds for the workspace (0 when none or when it did not fit).
    int64_t workspaceBytes() const {
        return m_workspaceBytes.load();
    }
    /// Reserved bytes may not exceed `bytes`; 0 removes the budget (the settings stay).
    void setBudget(int64_t bytes);
    int64_t budget() const {
        return m_budget.load();
    }
    /// Bytes in blocks handed out to counting threads (rounded to the allocator's blocks).
    int64_t allocated() const {
        return m_allocated.load();
    }
    /// Bytes in the allocator's segments: allocated plus the cache.
    int64_t reserved() const {
        return m_reserved.load();
    }
    /// Highest allocated() since the last resetPeak().
    int64_t peak() const {
        return m_peak.load();
    }
    /// Highest reserved() since the last resetPeak().
    int64_t peakReserved() const {
        return m_peakReserved.load();
    }
    void resetPeak();
    /// How often the allocator flushed its cache to retry an allocation (num_alloc_retries).
    int64_t allocRetries() const {
        return m_allocRetries.load();
    }
    /// torch.cuda.empty_cache(): cached segments go back to the budget.
    void emptyCache();
    /// The model's failure for the most recent OOM it raised (not an injected one).
    AllocationFailure lastFailure() const;
    /// The current model's segments and blocks (memory snapshots, the segment view).
    std::vector<SegmentView> segments() const;
    /// The segments as they were when the model raised its most recent OOM, before anything of
    /// the failed micro-batch was freed (empty when none was raised).
    std::vector<SegmentView> segmentsAtLastFailure() const;
    /// OOMs the model raised since start-up (not injected ones): a new number is a new failure.
    int64_t failures() const {
        return m_failures.load();
    }
    /// Whether the current model counts bytes exactly (no segments to show).
    bool exact() const;
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
    CountingAllocator();
    static void release(void* data);
    /// Runs `change` on `model` (with m_mutex held) and adds what it changed in the model's
    /// counters to the atomics; returns what `change` returns.
    template <typename Change>
    auto changeModel(CachingAllocatorModel& model, Change change);

    mutable std::mutex m_mutex;
    /// Every model used since start-up (a block goes back to its own); the last is current.
    std::vector<std::unique_ptr<CachingAllocatorModel>> m_models;
    AllocationFailure m_lastFailure;
    std::vector<SegmentView> m_segmentsAtFailure;
    int64_t m_workspaceAddress = 0;
    size_t m_workspaceModel = 0;
    std::atomic<int64_t> m_workspaceBytes{0};
    std::atomic<int64_t> m_reserved{0};
    std::atomic<int64_t> m_peakReserved{0};
    std::atomic<int64_t> m_allocRetries{0};
    std::atomic<int64_t> m_failures{0};

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
