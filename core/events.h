#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

/// Value structs the engine reports while it runs. No tensors, no Qt: they are copied across
/// threads to the GUI controller and written as JSON Lines by the CLI.
///
/// Units: bytes for memory, samples for batch sizes, seconds for durations. `time` fields are
/// seconds since the trainer started its run.
namespace batchpilot::core {

/// Lifecycle of a run.
enum class RunState { Idle, Starting, Probing, Training, Paused, Stopping, Finished, Failed };

/// Where in a micro-batch an out-of-memory error happened.
enum class Phase { Copy, Forward, Backward, OptimizerStep, Setup };

/// Why a probe started.
enum class ProbeReason { Initial, UserRequest, DeviceSwitch, TargetBatchChange, Regrow };

const char* toString(RunState state);
const char* toString(Phase phase);
const char* toString(ProbeReason reason);

struct RunStateChanged {
    double time = 0;
    RunState state = RunState::Idle;
    std::string detail;  ///< e.g. the device and model when starting, the reason when failing
};

struct ProbeStarted {
    double time = 0;
    int sequence = 0;  ///< 1 for the first probe of a run, +1 for every re-probe
    ProbeReason reason = ProbeReason::Initial;
    std::string device;
    int64_t upperBound = 0;      ///< largest micro-batch the probe may choose (samples)
    int64_t usableBytes = 0;     ///< capacity minus headroom
    int64_t reservedBytes = 0;   ///< optimizer state held back during this probe (bytes)
};

struct ProbeTrial {
    double time = 0;
    int sequence = 0;
    int trial = 0;             ///< 1-based trial number within this probe
    int64_t microBatch = 0;    ///< samples tried
    bool fit = false;          ///< ran forward and backward without running out of memory
    bool withinHeadroom = false;  ///< fit and its peak stayed under the usable bytes
    int64_t peakBytes = 0;     ///< peak device memory during the trial
    int64_t failedAllocationBytes = 0;  ///< size of the allocation that failed (OOM only)
    double seconds = 0;
};

struct ProbeFinished {
    double time = 0;
    int sequence = 0;
    int64_t microBatch = 0;
    int64_t accumulationSteps = 0;  ///< micro-batches per training batch at this size
    int64_t targetBatch = 0;
    int trials = 0;
    double seconds = 0;
    bool hitTrialLimit = false;
    double fixedBytes = 0;      ///< memory model intercept (bytes), 0 when not fitted
    double bytesPerSample = 0;  ///< memory model slope (bytes per sample), 0 when not fitted
};

struct OomEvent {
    double time = 0;
    int64_t step = 0;
    Phase phase = Phase::Forward;
    int64_t microBatch = 0;
    int64_t requestedBytes = 0;  ///< allocation that failed, 0 when unknown
    std::string message;
    bool recovered = false;
    int64_t newMicroBatch = 0;   ///< size used for the retry (when recovered)
};

struct MemorySample {
    double time = 0;
    int64_t allocatedBytes = 0;
    int64_t reservedBytes = 0;  ///< allocator cache (CUDA); equals allocated elsewhere
    int64_t peakBytes = 0;      ///< peak since the last reset (per micro-batch or trial)
    int64_t capacityBytes = 0;
    int64_t headroomBytes = 0;  ///< usable limit: capacity × (1 − headroom)
};

struct StepMetrics {
    double time = 0;
    int64_t step = 0;           ///< optimizer steps done, 1-based
    int64_t epoch = 0;          ///< 0-based epoch the batch came from
    int64_t samplesSeen = 0;
    double loss = 0;            ///< mean loss over the whole training batch
    int64_t microBatch = 0;     ///< largest micro-batch used in this step
    int64_t accumulationSteps = 0;
    int64_t targetBatch = 0;
    double learningRate = 0;
    double samplesPerSecond = 0;
    double stepSeconds = 0;
    int64_t peakBytes = 0;      ///< peak device memory during this step
    int64_t totalSteps = 0;     ///< step limit of the run, 0 when unbounded
};

struct MicroBatchDone {
    double time = 0;
    int64_t step = 0;           ///< the optimizer step this micro-batch belongs to (1-based)
    int64_t index = 0;          ///< position among this batch's committed micro-batches, 0-based
    int64_t offset = 0;         ///< first sample's position within the training batch
    int64_t size = 0;
    int64_t targetBatch = 0;
    double lossWeight = 0;      ///< n_i / T applied to this micro-batch's mean loss
    double loss = 0;            ///< this micro-batch's mean loss (unweighted)
    bool probeTrial = false;    ///< the micro-batch was a probe trial whose gradients were kept
    std::vector<int64_t> sampleIndices;  ///< only when TrainerOptions::reportSampleIndices
};

struct OptimizerStepped {
    double time = 0;
    int64_t step = 0;
    int64_t microBatches = 0;
};

struct TargetBatchChanged {
    double time = 0;
    int64_t oldTarget = 0;
    int64_t newTarget = 0;
    double oldLearningRate = 0;
    double newLearningRate = 0;
};

struct DeviceSwitched {
    double time = 0;
    std::string from;
    std::string to;
};

struct Warning {
    double time = 0;
    std::string message;
};

struct CheckpointSaved {
    double time = 0;
    int64_t step = 0;
    std::string path;
};

struct ErrorEvent {
    double time = 0;
    std::string message;  ///< what went wrong and what to do
    std::string where;    ///< e.g. "step 3, micro-batch 2 (32 samples), forward"
};

using Event = std::variant<RunStateChanged, ProbeStarted, ProbeTrial, ProbeFinished, OomEvent,
                           MemorySample, StepMetrics, MicroBatchDone, OptimizerStepped,
                           TargetBatchChanged, DeviceSwitched, Warning, CheckpointSaved,
                           ErrorEvent>;

/// Name of the event type as written in JSON Lines ("probe_trial", "oom", ...).
const char* eventName(const Event& event);

/// Receives events. Called on the trainer's thread; implementations that hand events to another
/// thread must copy them (they are plain values) and must not block for long.
class EventSink {
public:
    virtual ~EventSink() = default;
    virtual void onEvent(const Event& event) = 0;
};

}  // namespace batchpilot::core
