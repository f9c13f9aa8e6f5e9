#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/config/device_spec.h"
#include "core/config/options.h"
#include "core/data/dataset.h"

namespace batchpilot::core {

/// Loads the next micro-batch on a background thread while the current one computes. Its
/// allocations are host memory and do not count against a virtual device (only the trainer
/// thread counts).
///
/// Thread rules: request() and take() are called by the trainer thread; loading happens on the
/// prefetcher's own thread. The destructor waits for a load in progress.
class Prefetcher {
public:
    explicit Prefetcher(std::shared_ptr<const Dataset> data);
    ~Prefetcher();
    Prefetcher(const Prefetcher&) = delete;
    Prefetcher& operator=(const Prefetcher&) = delete;

    /// Starts loading `indices` in the background, replacing a request not yet taken.
    void request(std::vector<int64_t> indices);
    /// The samples at `indices`: the prefetched batch when it was requested, otherwise loaded
    /// now. Errors of a background load are rethrown here.
    Batch take(const std::vector<int64_t>& indices);
    /// Batches served from the background so far (for tests and benchmarks).
    int64_t hits() const { return m_hits; }

private:
    void loop();

    std::shared_ptr<const Dataset> m_data;
    std::mutex m_mutex;
    std::condition_variable m_wake;
    std::optional<std::vector<int64_t>> m_pending;  ///< requested, not started
    std::vector<int64_t> m_loadingIndices;          ///< being loaded or loaded
    bool m_loading = false;
    std::optional<Batch> m_ready;
    std::exception_ptr m_error;
    bool m_stop = false;
    int64_t m_hits = 0;
    std::thread m_thread;
};

/// Whether the trainer asks for the next micro-batch ahead of time (TrainerOptions::prefetch):
/// Thread yes, Inline no; Auto on a CUDA device, and elsewhere where `threads` intra-op threads
/// and `reservedCpus` busy with other work leave one of the process's `cpus` free.
bool loadsAhead(Prefetch mode, DeviceKind device, int threads, int reservedCpus, int cpus);

}  // namespace batchpilot::core
