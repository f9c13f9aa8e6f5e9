#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/memory/segment_view.h"

/// Value structs the engine reports while it runs. No tensors, no Qt: they are copied across
/// threads to the GUI controller and written as JSON Lines by the CLI.
///
/// Units: bytes for memory, samples for batch sizes, seconds for durations. `time` fields are
/// seconds since the trainer started its run.
namespace batchpilot::core {

/// Lifecycle of a run.
enum class RunState { Idle, Starting, Probing, Training, Paused, Stopping, Finished, Failed };

/// Where in a micro-batch an out-of-memory error happened.
enum class Phase { Copy, Forward, Backward, OptimizerStep, Setup, Validation };

/// Why a probe started.
enum class ProbeReason { Initial, UserRequest, DeviceSwitch, TargetBatchChange, Regrow, MemorySavers };

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
    int64_t upperBound = 0;     ///< largest micro-batch the probe may choose (samples)
    int64_t usableBytes = 0;    ///< capacity minus headroom
    int64_t reservedBytes = 0;  ///< optimizer state held back during this probe (bytes)
};

struct ProbeTrial {
    double time = 0;
    int sequence = 0;
    int trial = 0;                      ///< 1-based trial number within this probe
    int64_t microBatch = 0;             ///< samples tried
    bool fit = false;                   ///< ran forward and backward without running out of memory
    bool withinHeadroom = false;        ///< fit and its peak stayed under the usable bytes
    int64_t peakBytes = 0;              ///< peak device memory during the trial
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

/// The fastest-micro-batch search timed a candidate once more (objective "fastest"): its median
/// samples per second over the timings counted so far (warm-ups are not counted).
struct ThroughputTimed {
    double time = 0;
    int sequence = 0;  ///< the probe this search follows
    int64_t microBatch = 0;
    double samplesPerSecond = 0;  ///< median of the counted timings, 0 while warming up
    int repetitions = 0;          ///< counted timings
};

/// A turn of the check on whole training batches ended (SizeChoice::startBatchCheck): a batch of
/// the largest between two of the size the search chose. One per turn, so that the check's
/// progress shows while it runs (up to probe.check_seconds).
struct ThroughputChecked {
    double time = 0;
    int sequence = 0;
    int64_t microBatch = 0;         ///< the size the search chose
    int64_t largestMicroBatch = 0;  ///< the largest that fits
    int turn = 0;                   ///< from 1
    double ratio = 0;               ///< this turn's: the chosen size's speed over the largest's
    double gain = 0;                ///< the median of the turns so far
    double gainLow = 0;             ///< where it lies with 95% confidence (core::medianInterval)
    double gainHigh = 0;
};

/// The fastest-micro-batch search decided. Every timed micro-batch trained (nothing was wasted).
struct ThroughputChosen {
    double time = 0;
    int sequence = 0;
    int64_t microBatch = 0;         ///< the size training uses from now on
    int64_t largestMicroBatch = 0;  ///< the largest that fits (the first candidate)
    int64_t accumulationSteps = 0;  ///< micro-batches per training batch at the chosen size
    int64_t targetBatch = 0;
    double samplesPerSecond = 0;         ///< measured at the chosen size
    double largestSamplesPerSecond = 0;  ///< measured at the largest
    /// The chosen size's speed over the largest's, measured in turns (drift cancelled: a better
    /// figure than the two medians' ratio); 1 when the largest was kept, 0 when not measured.
    double speedOverLargest = 0;
    /// The same per whole training batch: speedOverLargest's micro-batches plus what a batch costs
    /// besides them (the two below), each size with its own number of micro-batches
    /// (core::stepSpeedOverLargest). What the decision claims; 0 when speedOverLargest is.
    double stepSpeedOverLargest = 0;
    double stepSeconds = 0;        ///< per training batch besides its micro-batches (the optimizer step, …)
    double microBatchSeconds = 0;  ///< per micro-batch besides its own timed work (0 with the above: not yet measured)
    int microBatchesTimed = 0;     ///< timed micro-batches, warm-ups included
    double seconds = 0;            ///< from the probe's end to the decision
    std::string reason;
    /// The check on whole training batches of a size below the largest (SizeChoice::
    /// startBatchCheck): each turn's speed of the size the search chose over the largest's.
    /// stepSpeedOverLargest is their median (1 when it found no gain and the largest was kept).
    /// Empty: not checked (stepSpeedOverLargest is then computed from the micro-batches).
    std::vector<double> batchRatios;
    /// Where the median of batchRatios lies with 95% confidence (core::medianInterval); 0 with
    /// no check. The decision kept the size the search chose when the median was above the tie.
    double batchGainLow = 0;
    double batchGainHigh = 0;
    double checkSeconds = 0;  ///< the check's share of `seconds`
};

struct OomEvent {
    double time = 0;
    int64_t step = 0;
    Phase phase = Phase::Forward;
    int64_t microBatch = 0;
    int64_t requestedBytes = 0;  ///< allocation that failed, 0 when unknown
    std::string message;
    bool recovered = false;
    int64_t newMicroBatch = 0;  ///< size used for the retry (when recovered)
    /// Samples of the batch, trained before the failed micro-batch, that are trained again: an OOM
    /// in backward leaves part of the micro-batch's gradient in the accumulators (backward adds
    /// into them in place), so the batch starts over from its first sample. 0: nothing redone.
    int64_t redoneSamples = 0;
    /// The memory snapshot written at this OOM (the allocator's segments and blocks as it failed,
    /// a pickle PyTorch's memory_viz opens), its name in the run folder; empty: none written (no
    /// run folder, no caching allocator to snapshot, or this rank's kMaxOomSnapshots were written).
    std::string snapshotFile;
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
    int64_t step = 0;   ///< optimizer steps done, 1-based
    int64_t epoch = 0;  ///< 0-based epoch the batch came from
    int64_t samplesSeen = 0;
    double loss = 0;         ///< mean loss over the whole training batch
    int64_t microBatch = 0;  ///< largest micro-batch used in this step
    int64_t accumulationSteps = 0;
    int64_t targetBatch = 0;
    double learningRate = 0;
    double samplesPerSecond = 0;
    double stepSeconds = 0;
    int64_t peakBytes = 0;   ///< peak device memory during this step
    int64_t totalSteps = 0;  ///< step limit of the run, 0 when unbounded
};

/// The model evaluated on the held-out data (TrainerOptions::validation): forward passes without
/// gradients, in eval mode (BatchNorm uses its running statistics), at a micro-batch of its own.
/// Training's state is not changed.
struct ValidationDone {
    double time = 0;
    int64_t step = 0;              ///< optimizer steps done when it ran
    int64_t epoch = 0;             ///< epochs of training completed
    int64_t samplesSeen = 0;       ///< training samples seen so far (the x axis comparing target batches)
    int64_t samples = 0;           ///< held-out samples evaluated (all of them)
    double loss = 0;               ///< mean loss per sample, as training defines it
    double accuracy = -1;          ///< top-1, 0..1; -1 when the targets are not class ids
    double top5Accuracy = -1;      ///< top-5, 0..1; -1 unless class ids and more than 5 classes
    double meanSquaredError = -1;  ///< regression data only; -1 otherwise
    double meanAbsoluteError = -1;
    int64_t microBatch = 0;  ///< the largest validation micro-batch that ran
    int ooms = 0;            ///< out-of-memory errors recovered during this pass
    double seconds = 0;
};

/// The validation metrics by the names run summaries, exports and CheckpointOptions::keepBest
/// give them: val_loss, val_accuracy, val_top5_accuracy, val_mse, val_mae.
const std::vector<std::string>& validationMetricNames();
/// Whether a higher value of the named metric is better (accuracies) or a lower one (losses, errors).
bool higherIsBetter(const std::string& metric);
/// Whether `value` of the named metric beats `best` strictly (a tie does not); every value beats
/// a NaN best (none yet), and a NaN value beats nothing.
bool improves(const std::string& metric, double value, double best);
/// The named metric of a validation pass; nullopt when the pass has none (accuracy of a
/// regression, top-5 with 5 classes or fewer) or the name is not a metric.
std::optional<double> validationMetric(const ValidationDone& done, const std::string& metric);

/// Several devices: one rank's part of an optimizer step (RanksStepped).
struct RankStep {
    int rank = 0;
    std::string device;
    int64_t share = 0;            ///< samples of the training batch this rank trained
    int64_t microBatch = 0;       ///< its largest micro-batch in the step
    int64_t microBatches = 0;     ///< micro-batches it committed (its accumulation steps)
    double computeSeconds = 0;    ///< from the batch's start until its gradients were ready
    double samplesPerSecond = 0;  ///< share / computeSeconds
    double waitSeconds = 0;       ///< waiting for the other ranks before the all-reduce
    int64_t peakBytes = 0;        ///< its device's peak in the step
    int ooms = 0;                 ///< out-of-memory errors it recovered from in the step
    bool settled = true;          ///< not probing (its speed says something of the next steps)
};

/// Several devices: an optimizer step of a data-parallel job, as every rank learned it from the
/// step's exchange (the same on every rank). The gradients were summed over the ranks once.
struct RanksStepped {
    double time = 0;
    int64_t step = 0;  ///< optimizer steps done, 1-based
    std::vector<RankStep> ranks;
    double allReduceSeconds = 0;  ///< summing the gradients over the ranks (after the wait)
    /// What summed them: "NCCL" (every rank on a GPU of its own) or "Gloo", and why not NCCL.
    std::string collectives;
    std::string collectivesWhy;
    /// Slowest over fastest compute time in the step (1: balanced).
    double imbalance = 0;
    /// The shares of the next full training batch when they change (empty: unchanged), and why.
    std::vector<int64_t> nextShares;
    std::string shareReason;
    /// Every rank's parameters were compared at this step (checksums equal, or the run failed).
    bool parametersChecked = false;
};

/// Several devices: another rank's probe and out-of-memory events since its last report, as that
/// rank emitted them (each rank's probe is its own). Rank 0 emits one at the end of a step for
/// each other rank that had any, before the step's RanksStepped; their times are moved to rank
/// 0's clock (seconds since its run started, as every event's).
struct RankProbed {
    double time = 0;
    int rank = 0;
    std::string device;
    std::vector<ProbeStarted> probes;
    std::vector<ProbeTrial> trials;
    std::vector<ProbeFinished> finished;
    std::vector<OomEvent> ooms;
};

struct MicroBatchDone {
    double time = 0;
    int64_t step = 0;    ///< the optimizer step this micro-batch belongs to (1-based)
    int64_t index = 0;   ///< position among this batch's committed micro-batches, 0-based
    int64_t offset = 0;  ///< first sample's position within the training batch
    int64_t size = 0;
    int64_t targetBatch = 0;
    double lossWeight = 0;               ///< n_i / T applied to this micro-batch's mean loss
    double loss = 0;                     ///< this micro-batch's mean loss (unweighted)
    bool probeTrial = false;             ///< the micro-batch was a probe trial whose gradients were kept
    std::vector<int64_t> sampleIndices;  ///< when TrainerOptions::reportSampleIndices or step mode
    /// L2 norm of the batch's accumulated gradient after this micro-batch was added (it grows
    /// towards the full-batch gradient's norm); 0 unless TrainerOptions::reportGradientNorm or
    /// step mode.
    double gradientNorm = 0;
};

/// What the run trains, reported once after setup (and again after a device switch).
struct RunSummary {
    double time = 0;
    std::string device;
    std::string model;
    int64_t parameterCount = 0;  ///< trainable scalars
    int64_t parameterTensors = 0;
    std::string dataset;
    int64_t datasetSize = 0;
    std::vector<int64_t> inputShape;  ///< one sample, e.g. {3, 32, 32}
    std::string optimizer;            ///< e.g. "adam, learning rate 0.003"
    std::string loss;                 ///< "cross-entropy" or "mse"
    int64_t targetBatch = 0;
    bool batchStatistics = false;  ///< the model has BatchNorm layers
};

/// Where the device memory goes, in bytes, measured by the meter at well-defined points:
/// parameters when the model was loaded onto the device, gradient accumulators when they were
/// created, optimizer state around the first optimizer step (or the reservation held for it
/// before that step), and per micro-batch the peak minus the memory resident when it started.
/// Reported after setup and after every optimizer step.
struct MemoryBreakdown {
    double time = 0;
    int64_t step = 0;  ///< optimizer steps done (0: after setup)
    std::string device;
    int64_t totalBytes = 0;      ///< the device's whole memory (virtual: its budget)
    int64_t capacityBytes = 0;   ///< what this run may use (CUDA: total minus other processes)
    int64_t usableBytes = 0;     ///< capacity minus the probe's headroom
    int64_t parameterBytes = 0;  ///< parameters and buffers (BatchNorm statistics)
    int64_t gradientBytes = 0;   ///< the batch's gradient accumulators
    int64_t optimizerStateBytes = 0;
    bool optimizerStateReserved = false;  ///< state not created yet: the bytes held back for it
    /// What the micro-batch of the largest peak added to the resident memory, less its input batch
    /// and BatchPilot's copy of the buffers: the layers' outputs kept for backward and the
    /// gradients in flight before backward adds them to the accumulators.
    int64_t activationBytes = 0;
    int64_t activationMicroBatch = 0;  ///< size of the micro-batch that peak belongs to
    int64_t inputBytes = 0;            ///< that micro-batch's inputs and targets on the device
    /// BatchPilot's own copies of the model's buffers (BatchNorm statistics): the batch's, kept
    /// for a batch that starts over, and the micro-batch's, for one that fails; 0 without buffers.
    int64_t bufferCopyBytes = 0;
    /// The largest parameter's gradient: backward holds each parameter's new gradient until it
    /// adds it to the accumulators, so the activations include up to this much of it.
    int64_t largestGradientBytes = 0;
    int64_t residentBytes = 0;  ///< measured before that micro-batch (between micro-batches)
    int64_t peakBytes = 0;      ///< measured peak of that micro-batch in tensors (resident + activations)
    /// What the caching allocator held at that micro-batch's peak beyond the tensors (its cache,
    /// rounding): reserved − allocated; 0 with exact counting and on the CPU.
    int64_t cacheBytes = 0;
    int64_t otherProcessBytes = 0;  ///< CUDA: total − driver free − reserved; 0 elsewhere
    /// A virtual GPU preset's CUDA context (outside PyTorch's allocator), 0 elsewhere.
    int64_t contextBytes = 0;
    /// A virtual GPU preset's cuBLAS workspace (allocated through the allocator), 0 elsewhere.
    int64_t workspaceBytes = 0;
    int64_t freeBytes = 0;  ///< total − peak − cache − other processes (never negative)
    /// The memory savers in use ("checkpoint", "bf16", "both"; "" for none): they shape the
    /// activations (core/config/memory_savers.h).
    std::string memorySavers;

    /// Parameters + gradients + optimizer state + activations + input batch + buffer copies +
    /// workspace: what the parts explain of the peak. It equals peakBytes when nothing else stayed
    /// resident.
    int64_t attributedBytes() const {
        return parameterBytes + gradientBytes + optimizerStateBytes + activationBytes + inputBytes + bufferCopyBytes +
               workspaceBytes;
    }
};

/// One memory-saver setting measured on the run's own model (SaverSurvey): its memory line,
/// fitted to micro-batches run with the saver on, the largest micro-batch that line predicts
/// within the usable memory, and the throughput timed there.
struct SaverOption {
    std::string savers;       ///< "off", "checkpoint", "bf16" or "both"
    std::string unavailable;  ///< why it was not measured (the model cannot be split...); empty: measured
    bool fits = false;        ///< the smallest micro-batch fits in the usable memory
    double fixedBytes = 0;    ///< peak ≈ fixedBytes + bytesPerSample × micro-batch
    double bytesPerSample = 0;
    int64_t microBatch = 0;         ///< predicted largest micro-batch (at most the target batch)
    int64_t accumulationSteps = 0;  ///< micro-batches per training batch at that size
    int64_t peakBytes = 0;          ///< predicted peak at microBatch
    double samplesPerSecond = 0;    ///< timed at timedMicroBatch (forward and backward)
    int64_t timedMicroBatch = 0;
    int64_t trials = 0;  ///< micro-batches run to measure it
};

/// Every memory saver measured side by side on the run's model and device (memory savers,
/// core/config/memory_savers.h): after a probe found a small micro-batch (TrainerOptions::saverThreshold),
/// when nothing fits, or when asked (Trainer::surveySavers). The measurements run forward and
/// backward on the data's first samples and keep nothing: the model, its statistics and the
/// batch's gradients are as before.
struct SaverSurvey {
    double time = 0;
    int64_t step = 0;  ///< optimizer steps done when it ran
    std::string device;
    std::string reason;  ///< why it ran, in words
    int64_t usableBytes = 0;
    int64_t targetBatch = 0;
    std::string current;  ///< the savers in use when it ran ("off", "checkpoint", ...)
    std::vector<SaverOption> options;
    /// The savers with the best predicted throughput, when it is not the current one and beats it
    /// by more than 5% (or the current one does not fit); empty: keep the current savers.
    std::string suggestion;
    std::string advice;  ///< the outcome in one sentence, with the numbers
    double seconds = 0;  ///< the survey's time
};

/// The memory savers in use changed: memory_savers auto, or the user applied a survey's
/// suggestion. A probe follows (reason "memory savers turned on").
struct MemorySaversChanged {
    double time = 0;
    int64_t step = 0;
    std::string from;
    std::string to;
    std::string why;
    int64_t predictedMicroBatch = 0;  ///< the last survey's prediction for `to`; 0: none
};

/// float16 autocast (memory savers fp16, checkpoint-fp16): the loss scale changed. After an
/// overflow (a gradient of the batch was inf or NaN) no optimizer step was taken and the same
/// batch is trained again at the lower scale: nothing is skipped. Otherwise it grew after
/// kLossScaleGrowthSteps steps without one.
struct LossScaleChanged {
    double time = 0;
    int64_t step = 0;  ///< the optimizer step the batch belongs to (1-based)
    double from = 0;
    double to = 0;
    bool overflow = false;      ///< true: lowered after an overflow; false: grown
    int64_t redoneSamples = 0;  ///< overflow: this rank's samples of the batch, trained again
};

/// The next micro-batch in step-by-step mode: the trainer waits until advanced.
struct StepModeWaiting {
    double time = 0;
    int64_t step = 0;    ///< the optimizer step the micro-batch belongs to (1-based)
    int64_t index = 0;   ///< micro-batches of this batch already committed
    int64_t offset = 0;  ///< first sample's position within the training batch
    int64_t size = 0;    ///< samples it will hold
    int64_t targetBatch = 0;
    bool probeTrial = false;  ///< it is a probe trial (it may run out of memory)
};

/// Accumulated against full-batch gradient for one parameter tensor, or all of them.
struct TensorDifference {
    std::string name;
    int64_t elements = 0;
    double maxAbsDifference = 0;
    double relativeDifference = 0;  ///< ‖accumulated − full‖ / ‖full‖
    double cosineSimilarity = 1;
};

/// Relative difference up to which an accumulated float32 gradient counts as equal to the
/// one-pass gradient. float32 keeps about 7 significant digits; both ways sum the same 10^4–10^6
/// terms per weight in a different order, which costs up to about two of them (measured: 1e-6 to
/// 2e-5 overall on the built-in models without BatchNorm). BatchNorm's micro-batch statistics
/// cause 1e-3 and more.
constexpr double kRoundingTolerance = 1e-4;

/// Result of an equivalence check: the gradient of one batch computed by accumulating its
/// micro-batches with weights n_i / T, and in one full pass, compared tensor by tensor.
struct EquivalenceChecked {
    double time = 0;
    int64_t step = 0;                      ///< optimizer steps done when it ran
    int64_t samples = 0;                   ///< the check batch
    std::vector<int64_t> microBatchSizes;  ///< several devices: rank 0's part
    /// Several devices: every rank's part of the check batch, in that rank's micro-batches, and
    /// its device, by rank; their gradients were summed over the ranks as training sums them.
    std::vector<std::vector<int64_t>> rankMicroBatchSizes;
    std::vector<std::string> rankDevices;
    std::vector<TensorDifference> tensors;
    TensorDifference overall;
    bool batchStatistics = false;  ///< the model has BatchNorm: differences are expected
    /// BatchNorm models only: the overall relative difference of the same check with the
    /// running statistics (eval mode), where samples are normalised independently.
    double runningStatisticsRelativeDifference = -1;
    bool fullPassOutsideBudget = false;  ///< the full pass did not fit the virtual budget and ran in host memory
    /// Both ways ran the forward pass under bfloat16 autocast (memory savers bf16 or both): its
    /// rounding depends on the split, so differences far above float32 rounding are expected.
    bool bfloat16 = false;
    /// The same under float16 autocast (memory savers fp16, checkpoint-fp16).
    bool float16 = false;
    std::string explanation;  ///< what the numbers mean, in plain words
    std::string error;        ///< non-empty: the check could not run, and why
    double seconds = 0;

    /// The check ran and the overall difference is float32 rounding (kRoundingTolerance).
    bool equalUpToRounding() const { return error.empty() && overall.relativeDifference <= kRoundingTolerance; }
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
    int rank = 0;  ///< several devices: the rank that moved
};

struct Warning {
    double time = 0;
    std::string message;
};

struct CheckpointSaved {
    double time = 0;
    int64_t step = 0;
    std::string path;
    /// Empty: the latest checkpoint. Otherwise the best model so far by this validation metric
    /// (CheckpointOptions::keepBest), which reached `value` at `step`.
    std::string metric;
    double value = 0;
};

struct ErrorEvent {
    double time = 0;
    std::string message;  ///< what went wrong and what to do
    std::string where;    ///< e.g. "step 3, micro-batch 2 (32 samples), forward"
};

/// A caching allocator's memory, segment by segment (a virtual GPU that models PyTorch's caching
/// allocator): after setup and after an optimizer step when the segments changed since the last
/// report, and at every OOM as they were when the allocation failed, so that the window can show
/// what fragmented. Not reported where segments are not known: the CPU, exact counting.
struct AllocatorSegments {
    double time = 0;
    int64_t step = 0;  ///< optimizer steps done
    bool atOom = false;
    int64_t limitBytes = 0;  ///< what the segments may reserve in all
    // At an OOM, what failed (CUDA's message says the same):
    int64_t requestedBytes = 0;    ///< what the tensor asked for
    int64_t segmentBytes = 0;      ///< the segment it tried to reserve ("Tried to allocate")
    int64_t largestFreeBlock = 0;  ///< the largest cached block of the request's pool
    /// Enough bytes were free or cached, but no block or segment could hold the request in one piece.
    bool fragmentation = false;
    std::vector<SegmentView> segments;

    int64_t reservedBytes() const;
    int64_t allocatedBytes() const;
};

using Event =
    std::variant<RunStateChanged, ProbeStarted, ProbeTrial, ProbeFinished, OomEvent, MemorySample, StepMetrics,
                 MicroBatchDone, OptimizerStepped, TargetBatchChanged, DeviceSwitched, Warning, CheckpointSaved,
                 ErrorEvent, RunSummary, MemoryBreakdown, StepModeWaiting, EquivalenceChecked, ThroughputTimed,
                 ThroughputChosen, ValidationDone, RanksStepped, RankProbed, SaverSurvey, MemorySaversChanged,
                 LossScaleChanged, AllocatorSegments, ThroughputChecked>;

/// How a check's batch was accumulated: "16 + 16 + 8", or with several devices each rank's part,
/// "rank 0 (virtual:48MiB) 16 + 16, rank 1 (virtual:192MiB) 64, summed over the ranks".
std::string describeSplit(const EquivalenceChecked& check);
/// The micro-batches a check accumulated: with several devices, every rank's.
size_t microBatchCount(const EquivalenceChecked& check);

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
