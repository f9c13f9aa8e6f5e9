#include "core/base/hold_point.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace batchpilot::core {
namespace {

struct HoldRequest {
    std::string point;
    long count = 0;  ///< 0: none asked
};

HoldRequest readHoldRequest() {
    HoldRequest request;
    const char* text = std::getenv("BATCHPILOT_HOLD_AT");
    if (text == nullptr) return request;
    const std::string value(text);
    const size_t colon = value.rfind(':');
    request.point = value.substr(0, colon);
    request.count = 1;
    if (colon != std::string::npos) {
        char* end = nullptr;
        const long n = std::strtol(value.c_str() + colon + 1, &end, 10);
        request.count = (end != nullptr && *end == '\0' && n > 0) ? n : 0;
    }
    return request;
}

}  // namespace

void holdPoint(std::string_view point) {
    static const HoldRequest request = readHoldRequest();
    static std::atomic<long> reached{0};
    if (request.count == 0 || point != request.point) return;
    const long n = reached.fetch_add(1) + 1;
    if (n != request.count) return;
    std::fprintf(stderr, "held at %s %ld\n", request.point.c_str(), n);
    std::fflush(stderr);
    for (;;) ::pause();  // until a signal ends the process
}

}  // namespace batchpilot::core
