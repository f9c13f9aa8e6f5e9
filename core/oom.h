#pragma once

#include <cstdint>
#include <exception>
#include <string>

namespace batchpilot::core {

/// What a caught exception means for the trainer.
struct FailureInfo {
    bool outOfMemory = false;     ///< retrying with a smaller micro-batch can help
    int64_t requestedBytes = 0;   ///< failed allocation size when the message names it
    std::string message;          ///< the exception's message, first line
};

/// Classifies an exception as DESIGN.md says: c10::OutOfMemoryError, a c10::Error whose message
/// is a known allocator failure ("CUDA out of memory", "DefaultCPUAllocator: can't allocate
/// memory", "CUBLAS_STATUS_ALLOC_FAILED", "HIP out of memory") and std::bad_alloc are OOMs.
/// Everything else (shape errors, NaN losses, bad models) is not, and must not be retried.
FailureInfo classifyFailure(std::exception_ptr error);

/// True when `message` is one of the known allocator failure messages.
bool isOutOfMemoryMessage(const std::string& message);

}  // namespace batchpilot::core
