#pragma once

#include <atomic>

namespace batchpilot::core {

/// Lets long loads (datasets, model files) stop early when the user stops the run.
///
/// The trainer opens a CancelScope on its thread around loading; loaders call cancelFlag() once
/// on the calling thread (worker threads of at::parallel_for do not inherit the scope) and test
/// cancelled(flag) between files or rows, returning an error saying loading was cancelled.
///
/// Thread rules: the flag may be set from any thread; the scope belongs to one thread.
class CancelScope {
public:
    explicit CancelScope(const std::atomic<bool>& flag);
    ~CancelScope();
    CancelScope(const CancelScope&) = delete;
    CancelScope& operator=(const CancelScope&) = delete;

private:
    const std::atomic<bool>* m_previous;
};

/// The flag of the innermost CancelScope on this thread; nullptr outside any.
const std::atomic<bool>* cancelFlag();

inline bool cancelled(const std::atomic<bool>* flag) {
    return flag != nullptr && flag->load(std::memory_order_relaxed);
}

/// The message loaders return when they stopped for it.
inline constexpr const char* kLoadingCancelled = "loading was cancelled";

}  // namespace batchpilot::core
