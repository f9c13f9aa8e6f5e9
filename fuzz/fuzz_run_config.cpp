// loadRunConfig: a JSON run configuration file (--config, the GUI's Open), parsed and validated.
#include <cstdint>
#include <cstdlib>

#include "core/config/run_config.h"
#include "fuzz/fuzz_util.h"

using namespace batchpilot::core;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const auto file = batchpilot::fuzz::scratch() / "run.json";
    batchpilot::fuzz::writeFile(file, batchpilot::fuzz::asText(data, size));
    const auto loaded = loadRunConfig(file.string());
    if (!loaded) {
        if (loaded.error().empty()) std::abort();
        return 0;
    }
    // What loads is a valid run, and writing it out and reading it back gives the same run.
    const auto again = parseRunConfig(toRunConfig(*loaded));
    if (!again || toRunConfig(*again) != toRunConfig(*loaded)) std::abort();
    return 0;
}
