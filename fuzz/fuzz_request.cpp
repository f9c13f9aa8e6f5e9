// parseRequestHead: the line and headers of a request to batchpilot-cli --serve, from anyone who
// reaches the port, before any token is checked. Any bytes: a head or a refusal with an HTTP
// status and a message, never a crash; a head read holds at most the limits' headers, a method of
// token characters, a target that is a path, and a version the gate serves.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "app/request_head.h"

using namespace batchpilot;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const app::HeadLimits limits;
    const auto head = app::parseRequestHead(text, limits);
    if (!head) {
        const int status = head.error().status;
        if (head.error().message.empty() || (status != 400 && status != 431)) std::abort();
        return 0;
    }
    if (size > limits.maxHeadBytes || head->headers.size() > limits.maxHeaders) std::abort();
    if (head->method.empty() || head->target.empty() || head->target.front() != '/') std::abort();
    if (head->version != "HTTP/1.1" && head->version != "HTTP/1.0") std::abort();
    if (head->path().size() > head->target.size()) std::abort();
    (void)head->param("token");
    (void)head->header("Authorization");
    for (const auto& [name, value] : head->headers)
        if (name.empty() || value.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) std::abort();
    return 0;
}
