#include "core/oom.h"

#include <array>
#include <new>
#include <regex>
#include <string_view>

#include <c10/util/Exception.h>

namespace batchpilot::core {
namespace {

constexpr std::array<std::string_view, 4> kOomMessages{
    "CUDA out of memory",
    "DefaultCPUAllocator: can't allocate memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "HIP out of memory",
};

std::string firstLine(const std::string& text) {
    const auto end = text.find('\n');
    return end == std::string::npos ? text : text.substr(0, end);
}

/// Reads "tried to allocate 20.00 MiB" (CUDA) and "you tried to allocate 123 bytes" (CPU).
int64_t requestedBytesIn(const std::string& message) {
    static const std::regex withUnit(R"([Tt]ried to allocate ([0-9.]+) ?(bytes|B|KiB|MiB|GiB))");
    std::smatch match;
    if (!std::regex_search(message, match, withUnit)) {
        return 0;
    }
    double value = std::stod(match[1].str());
    const std::string unit = match[2].str();
    if (unit == "KiB") value *= 1024.0;
    if (unit == "MiB") value *= 1024.0 * 1024.0;
    if (unit == "GiB") value *= 1024.0 * 1024.0 * 1024.0;
    return static_cast<int64_t>(value);
}

}  // namespace

bool isOutOfMemoryMessage(const std::string& message) {
    for (std::string_view known : kOomMessages) {
        if (message.find(known) != std::string::npos) {
            return true;
        }
    }
    return false;
}

FailureInfo classifyFailure(std::exception_ptr error) {
    FailureInfo info;
    try {
        std::rethrow_exception(error);
    } catch (const c10::OutOfMemoryError& e) {
        info.outOfMemory = true;
        info.message = firstLine(e.what_without_backtrace());
    } catch (const c10::Error& e) {
        info.message = firstLine(e.what_without_backtrace());
        info.outOfMemory = isOutOfMemoryMessage(info.message);
    } catch (const std::bad_alloc& e) {
        info.outOfMemory = true;
        info.message = std::string("host allocation failed (") + e.what() + ")";
    } catch (const std::exception& e) {
        info.message = firstLine(e.what());
    }
    // Not a catch-all that swallows: anything that is not a std::exception propagates.
    if (info.outOfMemory) {
        info.requestedBytes = requestedBytesIn(info.message);
    }
    return info;
}

}  // namespace batchpilot::core
