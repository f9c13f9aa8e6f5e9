#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/options.h"
#include "core/events/events.h"
#include "core/memory/caching_allocator.h"

namespace batchpilot::core {

class Model;

/// How a run ended.
struct RunResult {
    RunState state = RunState::Finished;  ///< Finished (limit reached or stopped) or Failed
    bool stopped = false;                 ///< ended by stop()
    std::string error;                    ///< Failed only: what went wrong and what to do
    int64_t steps = 0;                    ///< optimizer steps committed
    int64_t microBatch = 0;               ///< micro-batch size in use at the end
    /// Failed only: the cause was the user's input (options, the data or model file, the
    /// checkpoint to resume from or the checkpoint folder), not training itself.
    bool badInput = false;
    /// A checkpoint could not be written (the last failure's message); empty when every save worked.
    std::string checkpointError;
};

/// Trains a model at a target batch: probes the largest micro-batch that fits the device,
/// accumulates gradients exactly to the target batch, recovers from out-of-memory errors without
/// losing or repeating a sample, and reports everything as events.
///
/// Thread rules: construct anywhere; run() on the thread that will own every tensor (the worker);
/// the command methods (pause … switchDevice) may be called from any thread at any time, also
/// from inside the event sink. Stop and pause act within one micro-batch; target batch, device
/// and re-probe at the next training-batch boundary.
class Trainer {
public:
    Trainer(TrainerOptions options, EventSink& sink);
    ~Trainer();
    Trainer(const Trainer&) = delete;
    Trainer& operator=(const Trainer&) = delete;

    /// Runs until the step or epoch limit, stop(), or an error. Never throws: errors are reported
    /// as an ErrorEvent and in the result, and the model keeps its last committed state.
    RunResult run();

    void pause();
    void resume();
    void stop();
    /// Applies at the next training batch; the learning rate is rescaled by `rule`, or by the
    /// run's TrainerOptions::lrScaling when none is given.
    void setTargetBatch(int64_t target, std::optional<LrScaling> rule = std::nullopt);
    /// Re-runs the probe on the current device at the next training batch.
    void reprobe();
    /// Moves parameters and optimizer state to `device` at the next training batch, then
    /// re-probes. An invalid or too small device is reported as a Warning and ignored.
    /// With several devices, `rank` names the rank that moves; every rank agrees on the switch at
    /// the same batch, and the shares follow the new device's probe.
    void switchDevice(const std::string& device, int rank = 0);

    /// Step-by-step mode, for teaching: before each micro-batch the trainer reports
    /// StepModeWaiting and waits for advance() or finishBatch(). Turning it off lets the run go on.
    /// Sample indices and the running gradient norm are reported while it is on.
    void setStepMode(bool on);
    /// Step-by-step mode: runs exactly one more micro-batch (a probe trial that runs out of memory
    /// counts as one).
    void advance();
    /// Step-by-step mode: runs the rest of the current training batch and its optimizer step,
    /// then waits before the next batch's first micro-batch.
    void finishBatch();
    /// At the next training-batch boundary, checks that accumulation gives the full-batch
    /// gradient (reported as EquivalenceChecked): the last training batch, or its first `samples`
    /// samples when 0 < samples < its size, is split as the current micro-batch plan splits it and
    /// compared with one full pass. Training state is not changed.
    void checkEquivalence(int64_t samples = 0);
    /// At the next training-batch boundary, measures every memory saver on the model and device
    /// side by side (reported as SaverSurvey, with a suggestion). Training state is not changed.
    void surveySavers();
    /// Uses `savers` (not Auto) from the next training batch on, and probes again (reported as
    /// MemorySaversChanged). Checkpointing a model that cannot be split is refused with a Warning.
    void setMemorySavers(MemorySavers savers);

    /// The trained model (valid after run() started; use from the run() thread or after run()).
    std::shared_ptr<Model> model() const;

private:
    struct Impl;
    std::unique_ptr<Impl> m_impl;
};

/// The virtual GPU's allocator as a memory snapshot shows it (memory_snapshot.h): its segments as
/// the last out-of-memory error it raised found them (`atOom` set), else as they are now. Empty
/// when it holds no segment (no run yet, or an exact virtual device, which has none).
std::vector<SegmentView> virtualGpuSegments(bool* atOom = nullptr);

}  // namespace batchpilot::core
