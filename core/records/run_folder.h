#pragma once

// Runs you can find again: every run (CLI and desktop app) writes a folder under a runs
// directory holding its configuration (config.json), every event (events.jsonl, the CLI's
// --events format) and a summary (summary.json: best and last of each metric, time, samples,
// micro-batch, OOMs), rewritten atomically as the run goes on. Torch-free.

#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <tl/expected.hpp>

#include "core/events/events.h"
#include "core/config/options.h"

namespace batchpilot::core {

/// Where runs are kept unless told otherwise: $BATCHPILOT_RUNS_DIR, else
/// $XDG_DATA_HOME/batchpilot/runs, else $HOME/.local/share/batchpilot/runs; empty when none of
/// those is set.
std::string defaultRunsDirectory();

/// A folder name for a run started at `when` (local time): "20261201-204210-cnn-synthetic" —
/// the model's name (a file's stem) and the data set's, reduced to letters, digits, '-' and '_'.
std::string runFolderName(const TrainerOptions& options, std::time_t when);

/// The run folder's subfolder for checkpoints asked for without a directory.
inline constexpr const char* kRunCheckpointFolder = "checkpoint";

/// True when `options` ask for checkpoints (an interval, or keeping the best model) without
/// naming a directory: the run's folder keeps them (RunFolder::create).
bool checkpointsInRunFolder(const TrainerOptions& options);

/// Where a resumed run saves its checkpoints when no directory is named: the folder it resumes
/// from, or for a best model's folder (a checkpoint folder's best/) the checkpoint folder above
/// it, so that the kept model is replaced only by a better one, not by the run's latest state.
std::string resumedCheckpointDirectory(const std::string& resumeFrom);

/// One metric over a run: its last value and its best (lowest loss or error, highest accuracy
/// or throughput), with the step each was reported at.
struct MetricTrack {
    bool higherIsBetter = false;
    int64_t count = 0;
    double last = 0;
    int64_t lastStep = 0;
    double best = 0;
    int64_t bestStep = 0;
    void add(double value, int64_t step);
};

/// The summary of a run, kept up to date from its events: what ran (model, data, device, target
/// batch), how it went (state, steps, samples, epochs, micro-batch, OOMs, seconds) and each
/// metric's track (train_loss, samples_per_second, val_loss, val_accuracy, val_top5_accuracy,
/// val_mse, val_mae), and where its latest checkpoint and best model were saved.
class RunSummaryBuilder {
public:
    void handle(const Event& event);
    /// The summary as summary.json holds it; `name` and `started` (ISO 8601) come from the folder.
    nlohmann::json toJson(const std::string& name, const std::string& started) const;
    const std::map<std::string, MetricTrack>& metrics() const { return m_metrics; }

private:
    std::optional<RunSummary> m_run;
    std::string m_state = "running";
    std::string m_error;
    int64_t m_steps = 0;
    int64_t m_samplesSeen = 0;
    int64_t m_epoch = 0;
    int64_t m_microBatch = 0;
    int64_t m_accumulationSteps = 0;
    int64_t m_targetBatch = 0;
    int64_t m_ooms = 0;
    double m_seconds = 0;
    std::string m_device;
    std::map<std::string, MetricTrack> m_metrics;
    std::optional<CheckpointSaved> m_checkpoint;      ///< the latest checkpoint saved
    std::optional<CheckpointSaved> m_bestCheckpoint;  ///< the best model saved
};

/// Records a run into its own folder. The folder is new (a name that exists gets "-2", "-3", …);
/// config.json is written when it is created, every event is appended to events.jsonl, and
/// summary.json is replaced (temporary file, fsync, rename) after each validation, every 50 steps
/// and when the run ends; events.jsonl is flushed at least every 250 ms besides (a window following
/// the run sees its events that soon). A write that fails (disk full) is remembered, reported once through
/// error(), and ends the recording; the run itself goes on.
class RunFolder : public EventSink {
public:
    /// Creates the run's folder under `runsDirectory` (created too when missing) and writes its
    /// config.json. When `options` ask for checkpoints without naming a directory
    /// (checkpointsInRunFolder), their directory becomes the folder's checkpoint/ first, and
    /// config.json records it; `options.runFolder` becomes the folder (memory snapshots at OOMs). Fails with a message
    /// naming the folder and what to do.
    static tl::expected<std::unique_ptr<RunFolder>, std::string> create(const std::string& runsDirectory,
                                                                        TrainerOptions& options,
                                                                        std::time_t when = std::time(nullptr));
    ~RunFolder() override;

    void onEvent(const Event& event) override;
    /// Writes summary.json now and flushes events.jsonl (also done when the run ends).
    void flush();

    const std::string& path() const { return m_path; }
    const std::string& name() const { return m_name; }
    /// The first write failure, empty while everything was written.
    const std::string& error() const { return m_error; }

private:
    RunFolder() = default;
    void fail(const std::string& what);
    void writeSummary();

    std::string m_path;
    std::string m_name;
    std::string m_started;
    std::ofstream m_events;
    RunSummaryBuilder m_summary;
    std::string m_error;
    int64_t m_stepsSinceSummary = 0;
    std::chrono::steady_clock::time_point m_lastFlush = std::chrono::steady_clock::now();
};

/// What summary.json holds, read back (the desktop app's runs list): the JSON object, or why it
/// cannot be read. A file larger than 1 MiB is refused (a summary is a few KiB).
tl::expected<nlohmann::json, std::string> readRunSummary(const std::string& runFolder);

}  // namespace batchpilot::core
