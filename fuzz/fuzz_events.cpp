// exportRunCsv: a run folder's events.jsonl (--export-csv, the window's Compare runs) read line by
// line into the series table: lines over 16 MiB, nested over 16 levels, not JSON or not UTF-8 are
// skipped and counted, never a crash or memory that follows what a line claims.
#include <cstdint>
#include <cstdlib>

#include "core/records/series_export.h"
#include "fuzz/fuzz_util.h"

using namespace batchpilot::core;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const auto folder = batchpilot::fuzz::scratch() / "run";
    std::filesystem::create_directories(folder);
    batchpilot::fuzz::writeFile(folder / "events.jsonl", batchpilot::fuzz::asText(data, size));
    const auto exported = exportRunCsv(folder.string(), (folder / "series.csv").string());
    if (!exported) {
        if (exported.error().empty()) std::abort();
        return 0;
    }
    // What it says it read and wrote cannot be negative (counters that wrapped).
    if (exported->events < 0 || exported->skipped < 0 || exported->rows < 0) std::abort();
    return 0;
}
