#pragma once

// Every series a run's charts draw, as one tidy CSV table that any spreadsheet opens: one row per
// value, with the columns
//
//   series,step,samples_seen,time_s,micro_batch,value
//
// where `series` names the quantity (train_loss, val_accuracy, memory_allocated_bytes, …, see
// docs/guide/run-folders.md), `step` is the optimizer steps done when it was measured, `samples_seen` the training
// samples seen by then, `time_s` seconds since the run started and `micro_batch` the size the row
// belongs to (probe trials, timings, OOMs); a column that does not apply is empty. Built from the
// events as JSON objects (a run folder's events.jsonl, or toJson() of live events). Torch-free.

#include <cstdint>
#include <ostream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tl/expected.hpp>

namespace batchpilot::core {

/// Every series name the table can hold, in the order docs/guide/run-folders.md lists them.
const std::vector<std::string>& exportedSeries();

/// Writes the table's rows to `out` as events are added (nothing is kept but the position).
class SeriesCsvWriter {
public:
    /// `only`: the series to write (a chart's own, e.g. {"train_loss", "val_loss"}); empty: all.
    explicit SeriesCsvWriter(std::ostream& out, std::vector<std::string> only = {});
    /// Adds the rows of one event; events that feed no chart add none.
    void add(const nlohmann::json& event);
    int64_t rows() const { return m_rows; }

private:
    void row(const char* series, const nlohmann::json& value, bool withStep = true,
             const nlohmann::json* micro = nullptr);

    std::ostream& m_out;
    std::vector<std::string> m_only;
    int64_t m_rows = 0;
    int64_t m_step = 0;  ///< optimizer steps done so far
    int64_t m_samplesSeen = 0;
    double m_time = 0;
};

/// What exportRunCsv did.
struct SeriesExport {
    std::string path;     ///< the CSV written
    int64_t rows = 0;     ///< data rows (without the header)
    int64_t events = 0;   ///< events read
    int64_t skipped = 0;  ///< lines that were not a JSON object (a run cut off mid-line, damage)
};

/// Reads `runFolder`/events.jsonl and writes the table to `outPath` (empty: `runFolder`/series.csv)
/// through a temporary file and a rename; `only` limits it to those series (empty: all). Only a
/// regular file (or nothing) at `outPath` is replaced. `stop`, asked before each event line: true
/// ends the export with the error "stopped", the temporary file removed and nothing replaced.
/// Errors name the file and what to do.
tl::expected<SeriesExport, std::string> exportRunCsv(const std::string& runFolder, std::string outPath = {},
                                                     const std::vector<std::string>& only = {},
                                                     const std::function<bool()>& stop = {});

}  // namespace batchpilot::core
