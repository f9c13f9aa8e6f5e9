#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include <tl/expected.hpp>

#include "core/config/options.h"
#include "core/events/events.h"
#include "core/train/checkpoint.h"

namespace batchpilot::core {

class Model;
class Optimizer;

/// A run's checkpoints (TrainerOptions::checkpoint): the folder, taken for the run; when the
/// latest is due; the best model by a validation metric; the last failed save. The trainer hands
/// it the state to save and reports the event each save returns.
///
/// Thread rules: the trainer's thread only.
class Checkpointer {
public:
    explicit Checkpointer(CheckpointOptions options) : m_options(std::move(options)) {}

    /// Whether the run saves checkpoints at all (a folder was given).
    bool enabled() const { return !m_options.directory.empty(); }
    /// Checks that the folder can be written and takes it for this run, before anything is
    /// loaded: the error says why not. The folder is held until release() (or the process ends);
    /// where the file system cannot lock, returns the warning to give.
    tl::expected<std::string, std::string> takeFolder();
    void release() { m_lock.reset(); }

    /// The latest is due after optimizer step `step` (every `every_steps`).
    bool dueAfter(int64_t step) const { return m_options.everySteps > 0 && step % m_options.everySteps == 0; }
    /// The end of a run at `step`: the latest is due unless it was saved at this step already.
    bool dueAtEnd(int64_t step) const { return enabled() && step > 0 && m_latestStep != step; }
    /// Whether the latest was saved at `step` (before a best model at the same step: saved again,
    /// so that it records the new best value).
    bool latestSavedAt(int64_t step) const { return m_latestStep == step; }

    /// Saves `state` with the model and the optimizer: the latest, or with `metric` the best
    /// model so far (its `value`) in the folder's best/. Returns what to report at `time`:
    /// CheckpointSaved, or a Warning that says why it was not saved (kept for lastError()).
    Event save(TrainerState state, const Model& model, const Optimizer& optimizer, double time,
               const std::string& metric = {}, double value = 0);
    /// A validation pass: the value of the kept metric when it beats every earlier pass
    /// (strictly: a tie keeps the earlier model), which becomes the best; nullopt otherwise, or
    /// when no best model is kept.
    std::optional<double> newBest(const ValidationDone& done);
    const std::string& keptMetric() const { return m_options.keepBest; }
    /// A resumed run goes on comparing with its checkpoint's best value, where it kept its best
    /// model by the same metric.
    void resume(const TrainerState& resumed);

    /// The last failed save's message (empty: none failed).
    const std::string& lastError() const { return m_lastError; }

private:
    CheckpointOptions m_options;
    std::optional<CheckpointFolderLock> m_lock;
    std::string m_lastError;
    /// The best value of keepBest so far, kept in every checkpoint; NaN: none yet.
    double m_bestValue = std::numeric_limits<double>::quiet_NaN();
    int64_t m_latestStep = -1;  ///< step of the latest checkpoint written (-1: none)
};

}  // namespace batchpilot::core
