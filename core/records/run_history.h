#pragma once

// Reading run folders back (core/records/run_folder.h writes them): the list of runs under a runs
// directory with their summaries, a run's curves from its events for comparing runs, and renaming
// and deleting a run. Torch-free; the desktop app's Compare runs tab reads runs through this.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tl/expected.hpp>

#include "core/events/event_json.h"

namespace batchpilot::core {

/// Reads the events file `eventsPath` (a run folder's events.jsonl) line by line and calls `visit`
/// with each JSON object, in order; blank lines are passed over, and lines that are not a JSON
/// object (a run cut off mid-line, damage, a line over kMaxEventLineBytes or nested deeper than
/// kMaxEventDepth) are counted and returned. Memory stays one bounded line. `stop`, when given,
/// is asked before each line: true ends the reading with the error "stopped". An error names the
/// file when it cannot be opened.
tl::expected<int64_t, std::string> forEachEvent(const std::string& eventsPath,
                                                const std::function<void(const nlohmann::json&)>& visit,
                                                const std::function<bool()>& stop = {});

/// A run folder found under a runs directory.
struct RunListing {
    std::string folder;      ///< its path
    nlohmann::json summary;  ///< summary.json as written (name, started, state, metrics, …)
};

/// The run folders directly under `runsDirectory` that hold a readable summary.json, newest
/// first (by their "started" time, then folder name); at most `limit`. Folders that are not runs
/// are left out; a missing directory is an empty list.
std::vector<RunListing> listRuns(const std::string& runsDirectory, std::size_t limit = 1000);

/// One value of a run's curve, with every x it can be drawn against.
struct CurvePoint {
    int64_t step = 0;         ///< optimizer steps done
    int64_t samplesSeen = 0;  ///< training samples seen (the fair axis when target batches differ)
    double time = 0;          ///< seconds since the run started
    double value = 0;
};

/// Keeps at most `limit` points of a curve however many are added, spread evenly over the whole
/// curve: past the limit every other point is dropped and only every `stride`-th new one is kept
/// (the stride doubling each time), so memory and drawing stay bounded on a run of any length.
class BoundedCurve {
public:
    BoundedCurve(std::vector<CurvePoint>& points, std::size_t limit)
        : m_points(points), m_limit(std::max<std::size_t>(limit, 2)) {}
    void add(const CurvePoint& p);
    /// Empties the curve and starts keeping every point again.
    void reset();

private:
    std::vector<CurvePoint>& m_points;
    std::size_t m_limit;
    std::size_t m_stride = 1;
    std::size_t m_seen = 0;
};

/// A run's curves: the training loss of every step and the validation results.
struct RunCurves {
    std::vector<CurvePoint> trainLoss;
    std::vector<CurvePoint> valLoss;
    std::vector<CurvePoint> valAccuracy;
    int64_t skipped = 0;  ///< lines of events.jsonl that were not JSON events
};

/// Reads `runFolder`/events.jsonl. Points beyond `maxPoints` per curve are thinned by keeping
/// every k-th (the file is read once, in order; memory stays bounded whatever the file holds).
tl::expected<RunCurves, std::string> readRunCurves(const std::string& runFolder, std::size_t maxPoints = 200'000);

/// Gives a run another display name (summary.json's "name"; the folder keeps its own). The name
/// must not be empty or longer than 200 characters.
tl::expected<void, std::string> renameRun(const std::string& runFolder, const std::string& name);

/// Deletes a run folder: only one that holds summary.json and events.jsonl and nothing but the
/// files a run writes (config.json, series.csv, checkpoint files, hidden temporaries), so a wrong
/// path never removes anything else.
tl::expected<void, std::string> deleteRun(const std::string& runFolder);

}  // namespace batchpilot::core
