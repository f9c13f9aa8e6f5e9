// parseDevice: "cpu", "cuda:N", "virtual:<size>[,...]" from the command line, the configuration
// and the GUI.
#include <cstdint>
#include <cstdlib>

#include "core/device/device.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto parsed = batchpilot::core::parseDevice(batchpilot::fuzz::asText(data, size));
    if (!parsed && parsed.error().empty()) std::abort();  // every refusal says why
    return 0;
}
