#include "core/device/oom.h"

#include <array>
#include <new>
#include <regex>
#include <string_view>
#include <vector>

#include <c10/util/Exception.h>

namespace batchpilot::core {
namespace {

// "CUDA driver error: out of memory" is how a failed mapping of expandable segments can arrive
// (not as OutOfMemoryError); "CUDA error: out of memory" is cudaErrorMemoryAllocation's text.
constexpr std::array<std::string_view, 7> kOomMessages{
    "CUDA out of memory",         "DefaultCPUAllocator: can't allocate memory",
    "CUBLAS_STATUS_ALLOC_FAILED", "HIP out of memory",
    "virtual GPU out of memory",  "CUDA driver error: out of memory",
    "CUDA error: out of memory",
};

/// Failures that may mean memory ran out (FailureInfo::maybeOutOfMemory).
constexpr std::array<std::string_view, 2> kMaybeOomMessages{
    "could not create a primitive",
    "CUDNN_STATUS_NOT_SUPPORTED",
};

constexpr std::string_view kInterpreterLine = "The following operation failed in the TorchScript interpreter";

/// Nested exceptions deeper than this are not followed (a chain that long is not from LibTorch).
constexpr int kMaxChain = 16;

std::string firstLine(const std::string& text) {
    const auto start = text.find_first_not_of(" \n\t");
    if (start == std::string::npos) return {};
    const auto end = text.find('\n', start);
    return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
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

/// One exception of the chain, as far as classification cares.
struct Link {
    bool oomType = false;
    std::string text;    ///< what the exception says, without a C++ backtrace
    std::string reason;  ///< the original error inside an interpreter message, else the text
    bool interpreter = false;
};

Link describe(std::exception_ptr error, std::exception_ptr* nested) {
    Link link;
    const auto nestedOf = [&](const std::exception& e) {
        if (const auto* n = dynamic_cast<const std::nested_exception*>(&e); n != nullptr) *nested = n->nested_ptr();
    };
    try {
        std::rethrow_exception(error);
    } catch (const c10::OutOfMemoryError& e) {
        link.oomType = true;
        link.text = e.what_without_backtrace();
        nestedOf(e);
    } catch (const c10::Error& e) {
        link.text = e.what_without_backtrace();
        nestedOf(e);
    } catch (const std::bad_alloc& e) {
        link.oomType = true;
        link.text = std::string("host allocation failed (") + e.what() + ")";
        nestedOf(e);
    } catch (const std::exception& e) {
        link.text = e.what();
        nestedOf(e);
    }
    // Not a catch-all that swallows: anything that is not a std::exception propagates.
    link.interpreter = link.text.find(kInterpreterLine) != std::string::npos;
    link.reason = innerTorchScriptError(link.text);
    return link;
}

/// "torch.OutOfMemoryError: …" or "OutOfMemoryError: …": an OOM named by its Python class.
bool namesOutOfMemoryClass(const std::string& reason) {
    const auto colon = reason.find(": ");
    const std::string head = reason.substr(0, colon);
    return colon != std::string::npos && head.size() >= 16 && head.ends_with("OutOfMemoryError");
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

std::string innerTorchScriptError(const std::string& text) {
    if (text.find(kInterpreterLine) == std::string::npos) return text;
    // The traceback lists source lines (which may say anything) and then the error, as
    // "RuntimeError: <reason>" (or another Python class). The last such line is the original one.
    static const std::regex errorLine(R"(^([A-Za-z_][A-Za-z0-9_.:]*(Error|Exception)): )");
    size_t found = std::string::npos;
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(start, end - start);
        if (std::regex_search(line, errorLine)) found = start;
        start = end + 1;
    }
    if (found == std::string::npos) return text;
    std::string reason = text.substr(found);
    constexpr std::string_view kRuntimeError = "RuntimeError: ";
    if (reason.starts_with(kRuntimeError)) reason.erase(0, kRuntimeError.size());
    while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
    return reason;
}

FailureInfo classifyFailure(std::exception_ptr error) {
    FailureInfo info;
    std::vector<Link> chain;
    for (int depth = 0; error && depth < kMaxChain; ++depth) {
        std::exception_ptr nested;
        chain.push_back(describe(error, &nested));
        error = nested;
    }
    if (chain.empty()) return info;
    for (const Link& link : chain) {
        const bool oom = link.oomType || isOutOfMemoryMessage(link.reason) || namesOutOfMemoryClass(link.reason);
        info.outOfMemory = info.outOfMemory || oom;
        for (std::string_view maybe : kMaybeOomMessages)
            if (link.reason.find(maybe) != std::string::npos) info.maybeOutOfMemory = true;
        info.insideTorchScript = info.insideTorchScript || link.interpreter;
        if (!info.detail.empty()) info.detail += "\n-- caused by --\n";
        info.detail += link.text;
    }
    // Each link's own reason, outermost first: an interpreter wrapper contributes the original
    // error at the end of its traceback, never its "The following operation failed" line.
    for (const Link& link : chain) {
        const std::string line = firstLine(link.reason);
        if (line.empty()) continue;
        info.message += (info.message.empty() ? "" : ": ") + line;
    }
    if (info.message.empty()) info.message = "unknown error";
    if (info.outOfMemory) {
        for (auto link = chain.rbegin(); link != chain.rend() && info.requestedBytes == 0; ++link) {
            info.requestedBytes = requestedBytesIn(link->reason);
        }
    }
    return info;
}

}  // namespace batchpilot::core
