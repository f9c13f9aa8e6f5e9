// A run folder's events.jsonl, read two ways: exportRunCsv (--export-csv, the window's Compare runs)
// line by line into the series table, and EventFileFollower (the window's Open run folder) into
// events, in small reads that cut lines anywhere. Lines over 16 MiB, nested over 16 levels, not
// JSON, not UTF-8 or not an event are skipped and counted, never a crash or memory that follows
// what a line claims; every event read is written again as a line that reads back into the
// same event (writing it a second time gives the same bytes); and no event read holds a number no
// run can have (a step, a batch, a share, a rank, a trial count past core/events/event_limits.h),
// which the window would spend time or memory on in proportion.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/events/event_file.h"
#include "core/events/event_json.h"
#include "core/records/series_export.h"
#include "fuzz/event_checks.h"
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

    EventFileFollower follower((folder / "events.jsonl").string());
    const size_t readBytes = size % 97 + 1;  // small reads, cut at a place the input chooses
    for (int reads = 0;; ++reads) {
        auto batch = follower.read(readBytes);
        if (!batch) std::abort();  // the file is there and does not shrink
        for (const Event& event : batch->events) {
            if (!batchpilot::fuzz::possible(toJson(event))) std::abort();
            const std::string line = toJsonLine(event);
            const auto again = eventFromJsonLine(line);
            if (!again || toJsonLine(*again) != line) std::abort();
        }
        if (batch->atEnd) break;
        if (reads > static_cast<int>(size) + 16) std::abort();  // every read makes progress
    }
    if (follower.bytesRead() + follower.pendingBytes() != static_cast<int64_t>(size)) std::abort();
    return 0;
}
