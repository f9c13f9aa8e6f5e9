#include "core/data/prefetcher.h"

#include <pthread.h>

#include "core/device/counting_allocator.h"

namespace batchpilot::core {

Prefetcher::Prefetcher(std::shared_ptr<const Dataset> data) : m_data(std::move(data)), m_thread([this] { loop(); }) {}

Prefetcher::~Prefetcher() {
    {
        std::lock_guard lock(m_mutex);
        m_stop = true;
    }
    m_wake.notify_all();
    m_thread.join();
}

void Prefetcher::request(std::vector<int64_t> indices) {
    {
        std::lock_guard lock(m_mutex);
        m_pending = std::move(indices);
    }
    m_wake.notify_all();
}

Batch Prefetcher::take(const std::vector<int64_t>& indices) {
    {
        std::unique_lock lock(m_mutex);
        const bool pendingMatches = m_pending && *m_pending == indices;
        const bool loadedMatches = (m_loading || m_ready || m_error) && m_loadingIndices == indices;
        if (pendingMatches || loadedMatches) {
            m_wake.wait(lock, [&] { return !m_pending && !m_loading; });
            if (m_loadingIndices == indices) {
                std::exception_ptr error = std::exchange(m_error, nullptr);
                std::optional<Batch> batch = std::exchange(m_ready, std::nullopt);
                if (error) std::rethrow_exception(error);
                if (batch) {
                    ++m_hits;
                    return std::move(*batch);
                }
            }
        }
    }
    CountingScope host(false);
    return m_data->get(indices);
}

void Prefetcher::loop() {
    // Named for top -H, debuggers and the thread benchmark (bench/bench_threads.cpp).
    pthread_setname_np(pthread_self(), "prefetch");
    CountingScope host(false);
    std::unique_lock lock(m_mutex);
    while (true) {
        m_wake.wait(lock, [&] { return m_stop || m_pending.has_value(); });
        if (m_stop) return;
        m_loadingIndices = std::move(*m_pending);
        m_pending.reset();
        m_ready.reset();
        m_error = nullptr;
        m_loading = true;
        const std::vector<int64_t> indices = m_loadingIndices;
        lock.unlock();
        std::optional<Batch> batch;
        std::exception_ptr error;
        try {
            batch = m_data->get(indices);
        } catch (const std::exception&) {
            error = std::current_exception();
        }
        lock.lock();
        m_loading = false;
        if (m_loadingIndices == indices) {
            m_ready = std::move(batch);
            m_error = error;
        }
        m_wake.notify_all();
    }
}

bool loadsAhead(Prefetch mode, DeviceKind device, int threads, int reservedCpus, int cpus) {
    switch (mode) {
    case Prefetch::Thread: return true;
    case Prefetch::Inline: return false;
    case Prefetch::Auto: break;
    }
    return device == DeviceKind::Cuda || threads + std::max(0, reservedCpus) < cpus;
}

}  // namespace batchpilot::core
