#pragma once

#include <cstdint>
#include <exception>
#include <string>

namespace batchpilot::core {

/// What a caught exception means for the trainer.
struct FailureInfo {
    bool outOfMemory = false;    ///< retrying with a smaller micro-batch can help
    int64_t requestedBytes = 0;  ///< failed allocation size when the message names it
    /// The real reason, one line: for an error raised inside a TorchScript model, the original
    /// error at the end of the interpreter's traceback ("virtual GPU out of memory: …"), never the
    /// interpreter's own first line.
    std::string message;
    /// Everything the chain said (every nested exception, the TorchScript traceback), for logs.
    std::string detail;
    bool insideTorchScript = false;  ///< the TorchScript interpreter wrapped the error
    /// A failure a math library also raises when memory runs out, without saying so: oneDNN's
    /// "could not create a primitive" (its scratch memory, PyPI's LibTorch under memory pressure)
    /// and cuDNN's CUDNN_STATUS_NOT_SUPPORTED (a workspace too large). The trainer takes it for an
    /// OOM above the smallest micro-batch, where the same shapes at a smaller size can work, and
    /// for the error it is at the smallest.
    bool maybeOutOfMemory = false;
};

/// Classifies an exception as DESIGN.md says, from the whole chain: the exception type, every
/// nested exception (std::nested_exception), and the full text of a TorchScript interpreter error,
/// whose traceback ends with the original error. OOMs: c10::OutOfMemoryError, std::bad_alloc, and
/// any error of the chain whose reason is a known allocator failure ("CUDA out of memory",
/// "DefaultCPUAllocator: can't allocate memory", "CUBLAS_STATUS_ALLOC_FAILED", "HIP out of memory",
/// the virtual GPU's "virtual GPU out of memory") or whose Python class is an OutOfMemoryError.
/// Everything else (shape errors, NaN losses, bad models) is not, and must not be retried.
FailureInfo classifyFailure(std::exception_ptr error);

/// True when `message` is one of the known allocator failure messages.
bool isOutOfMemoryMessage(const std::string& message);

/// The original error inside a TorchScript interpreter message: the text from the last
/// "SomeError: …" line of its traceback to the end, with a "RuntimeError: " prefix removed.
/// Text that is not an interpreter message is returned as it is.
std::string innerTorchScriptError(const std::string& text);

}  // namespace batchpilot::core
