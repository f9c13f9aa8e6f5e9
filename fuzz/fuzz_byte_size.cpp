// parseByteSize: "--device virtual:64MiB", "--headroom-bytes", configuration values.
#include <cstdint>
#include <cstdlib>

#include "core/base/byte_size.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto parsed = batchpilot::core::parseByteSize(batchpilot::fuzz::asText(data, size));
    if (parsed) {
        // What it accepts is a size: never negative, and what formatBytes prints of a size up to
        // a pebibyte reads back (beyond, the rounded figure may no longer fit).
        if (*parsed < 0) std::abort();
        if (*parsed < (int64_t{1} << 50) && !batchpilot::core::parseByteSize(batchpilot::core::formatBytes(*parsed))) {
            std::abort();
        }
    } else if (parsed.error().empty()) {
        std::abort();  // every refusal says why
    }
    return 0;
}
