#pragma once

// Private to the trainer's files (trainer*.cpp): the run's state and the helpers its parts share.
// Trainer::Impl is the run thread's state: what the run was given (options, sink, commands) and the
// run in named parts (Progress, Feed, Learner, Hardware, SizeChoice, ParallelState,
// Checkpointer), each a plain struct its methods read and change; its methods are grouped by
// concern in trainer.cpp (setup, the training loop, commands), trainer_probe.cpp (probe and
// device switch), trainer_memory.cpp (memory samples, breakdown, "does not fit"),
// trainer_equivalence.cpp and trainer_checkpoint.cpp.

#include "core/train/trainer.h"

#include <chrono>
#include <functional>
#include <map>
#include <cmath>
#include <optional>

#include "core/plan/loss_scaler.h"
#include "core/plan/validation_sizes.h"
#include "core/plan/accumulation_plan.h"
#include "core/plan/micro_batch_sizes.h"
#include "core/base/byte_size.h"
#include "core/train/checkpoint.h"
#include "core/train/checkpointer.h"
#include "core/train/command_mailbox.h"
#include "core/device/math_libraries.h"
#include "core/config/memory_savers.h"
#include "core/device/cuda_meter.h"
#include "core/device/counting_allocator.h"
#include "core/data/dataset.h"
#include "core/device/device.h"
#include "core/base/cancel.h"
#include "core/train/equivalence.h"
#include "core/events/event_json.h"
#include "core/nn/loss.h"
#include "core/nn/model.h"
#include "core/nn/model_factory.h"
#include "core/device/oom.h"
#include "core/optim/optimizer.h"
#include "core/data/prefetcher.h"
#include "core/distributed/process_group.h"
#include "core/plan/rank_shares.h"
#include "core/plan/probe_search.h"
#include "core/data/sampler.h"
#include "core/plan/saver_survey.h"
#include "core/plan/size_choice.h"
#include "core/base/text_format.h"
#include "core/plan/throughput_search.h"
#include "core/device/torch_compat.h"
#include "core/train/validation.h"

namespace batchpilot::core {
namespace trainer_detail {

using Clock = std::chrono::steady_clock;

/// The torch device a DeviceSpec's tensors live on (virtual devices are the CPU).
inline torch::Device torchDevice(const DeviceSpec& device) {
    return device.kind == DeviceKind::Cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index))
                                           : torch::Device(torch::kCPU);
}

/// A run-ending error with a message for the user (not retried).
/// What a run failed on, which decides its exit status (docs/RELIABILITY.md).
enum class FailureKind {
    Training,  ///< while training (exit 1)
    BadInput,  ///< before training, on what it was given: options, data, model, a checkpoint (exit 2)
};

struct FatalError {
    std::string message;
    std::string where;  ///< for people: "dataset", "step 12, optimizer step"
    /// Several devices: this rank fails because another one did (that one reported the cause).
    bool otherRankFailed = false;
    FailureKind kind = FailureKind::Training;
};

/// A run that cannot start from what it was given (`where`: the configuration, the dataset, the
/// model, a checkpoint to resume from or to write).
inline FatalError badInput(std::string message, std::string where) {
    return {std::move(message), std::move(where), false, FailureKind::BadInput};
}

/// The bytes a failed allocation needed: the peak since the meter's last reset (which includes
/// what stayed allocated) plus the request, or what the meter recorded of the failure.
int64_t neededBytes(const MemoryMeter& meter, int64_t requested);

/// A loss that is NaN or infinite: training cannot continue meaningfully.
class NonFiniteLoss : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Outcome of one micro-batch.
struct MicroResult {
    bool ok = false;
    FailureInfo failure;
    Phase phase = Phase::Copy;
    double loss = 0;
    int64_t peakBytes = 0;           ///< highest reserved during it (what the device held)
    int64_t peakAllocatedBytes = 0;  ///< highest allocated during it (what tensors held)
    int64_t residentBytes = 0;       ///< allocated when the micro-batch started
    int64_t inputBytes = 0;          ///< the micro-batch's inputs and targets on the device
    int64_t bufferCopyBytes = 0;     ///< the copy of the model's buffers kept during it
    double seconds = 0;
};

/// The micro-batch with the highest peak in a step, for the memory breakdown.
struct PeakRecord {
    int64_t resident = 0;
    int64_t peak = 0;  ///< reserved
    int64_t size = 0;
    int64_t input = 0;          ///< MicroResult::inputBytes
    int64_t bufferCopy = 0;     ///< MicroResult::bufferCopyBytes
    int64_t batchCopy = 0;      ///< the batch's copy of the buffers, resident during it (0: the batch's first)
    int64_t peakAllocated = 0;  ///< MicroResult::peakAllocatedBytes
    /// Keeps the micro-batch whose tensors peaked highest: with a caching allocator every
    /// micro-batch's reserved peak carries the cache the largest one left, so a short last
    /// micro-batch would otherwise stand for the step.
    void offer(const MicroResult& r, int64_t microBatch, int64_t batchCopyBytes) {
        if (r.peakAllocatedBytes > peakAllocated || (r.peakAllocatedBytes == peakAllocated && r.peakBytes > peak))
            *this = {r.residentBytes,   r.peakBytes,    microBatch,          r.inputBytes,
                     r.bufferCopyBytes, batchCopyBytes, r.peakAllocatedBytes};
    }
};

/// One training batch in progress (Trainer::Impl::trainBatch): what its micro-batches did so far.
struct BatchPass {
    int64_t offset = 0;     ///< samples of the batch trained
    int64_t committed = 0;  ///< micro-batches trained
    int64_t largestUsed = 0;
    int64_t stepPeak = 0;     ///< the highest peak of any micro-batch, failed ones included
    PeakRecord trainingPeak;  ///< committed micro-batches of the plan
    PeakRecord trialPeak;     ///< probe trials that fit (used when the step had only those)
    double lossSum = 0;
    double microSeconds = 0;  ///< the committed micro-batches' own timings, added up
    double waitSeconds = 0;   ///< waiting for the user (a pause, step mode's Advance), not training
    /// No probe trial, no failure and not trained again: its time is what a batch of its plan
    /// costs (StepCostWatch).
    bool clean = true;
    SizeChoice::BatchPlan plan;  ///< the sizes planned for the rest of the batch
    /// The size a check on whole batches wanted for every micro-batch of this one (0: no check
    /// was running when it started).
    int64_t checkSize = 0;
    /// The model's buffers (BatchNorm's statistics) as the batch found them, for a batch that
    /// starts over: its micro-batches then move them once, as in a run without the OOM. The
    /// first micro-batch's own copy, taken where an OOM is recovered; empty until it succeeded
    /// (nothing has moved them before that).
    std::vector<torch::Tensor> startBuffers;
};

/// Where the device memory goes: the parts of the memory breakdown (reportBreakdown), each
/// measured by the meter at the point named in MemoryBreakdown.
struct MemoryLedger {
    int64_t parameterBytes = 0;
    int64_t gradientBytes = 0;
    int64_t optimizerStateBytes = 0;
    PeakRecord lastPeak;  ///< the last step's highest micro-batch peak
};

/// The held-out data (core/train/validation.h) and where its passes stand.
struct HeldOut {
    std::shared_ptr<Dataset> data;  ///< null without validation
    /// The validation samples were taken out of the data set (makeValidation returned a smaller
    /// training set), rather than generated extra or read from --validation-data.
    bool outOfTraining = false;
    ValidationSizes sizes;  ///< the micro-batch of its passes
    int64_t lastStep = 0;   ///< step of the last validation pass
    int64_t epochs = 0;     ///< completed epochs at the last validation pass
};

/// What the memory reports last said, so that each says only what changed.
struct MemoryReported {
    double lastSample = -1;             ///< run time of the last MemorySample (-1: none yet)
    std::vector<SegmentView> segments;  ///< the allocator's segments
    int64_t failures = 0;               ///< the allocator's OOMs
    int64_t failuresBefore = 0;         ///< the allocator's OOMs before the meter was opened for this run
    int64_t allocatorRetries = 0;       ///< the meter's allocator retries
    int64_t allocatorOoms = 0;          ///< the meter's allocator OOMs
    int64_t snapshotted = 0;            ///< the allocator's OOM last written as a memory snapshot
    int snapshots = 0;                  ///< memory snapshots written in this run (kMaxOomSnapshots at most)
};

/// memory_savers auto's choices and the saver survey's.
struct SaverChoices {
    std::vector<MemorySavers> autoTried;    ///< turned on so far in this run (each at most once)
    std::optional<SaverSurvey> lastSurvey;  ///< what MemorySaversChanged's prediction comes from
    /// Why a survey is due at the next training batch (finishProbe found a micro-batch below
    /// TrainerOptions::saverThreshold); empty: none.
    std::string surveyDue;
};

/// Where the run stands: its clock, state, step and samples, and the target batch.
struct Progress {
    Clock::time_point start = Clock::now();
    RunState state = RunState::Idle;
    int64_t target = 0;  ///< the training batch's size (every rank's samples together)
    int64_t step = 0;
    int64_t samplesSeen = 0;
    std::vector<int64_t> lastBatch;  ///< indices of the last committed training batch
};

/// The data and how it reaches the model.
struct Feed {
    std::shared_ptr<Dataset> training;       ///< the training data (without the held-out samples)
    HeldOut validation;                      ///< the held-out data and where its passes stand
    std::optional<Sampler> sampler;          ///< the order of the training samples, epoch by epoch
    std::unique_ptr<Prefetcher> prefetcher;  ///< loads the next micro-batch during this one
    int cpus = 1;                            ///< the CPUs this process may run on (loadsAhead)
};

/// What learns and how: the model, its parameters and gradient accumulators, the optimizer, and
/// the memory savers and loss scale that change how a micro-batch trains.
struct Learner {
    std::shared_ptr<Model> model;
    std::unique_ptr<Optimizer> optimizer;
    std::vector<torch::Tensor> parameters;
    std::vector<torch::Tensor> gradients;    ///< accumulated, weighted gradients of the batch
    std::vector<torch::Tensor> reservation;  ///< optimizer state held back during the first probe
    /// The memory savers in use: options.memorySavers, or what "auto" turned on so far (never Auto).
    MemorySavers savers = MemorySavers::Off;
    SaverChoices saverChoices;  ///< what memory_savers auto tried, surveyed and has due
    LossScaler lossScaler;      ///< float16 autocast's loss scale (TrainerOptions::lossScale at first)
};

/// The device the run trains on and what is known of its memory.
struct Hardware {
    DeviceSpec device;
    std::unique_ptr<MemoryMeter> meter;
    MemoryLedger ledger;      ///< where the memory goes (the memory breakdown's parts)
    MemoryReported reported;  ///< what the memory reports last said
};

struct RankVote;  ///< one rank's requests at a batch boundary (trainer_parallel.cpp)

/// Several devices (trainer_parallel.cpp): this rank's view of the job.
struct ParallelState {
    std::shared_ptr<ProcessGroupLink> link;
    std::vector<std::string> devices;  ///< every rank's device, by rank
    /// Every rank's share of a full training batch (of `target` samples), by rank.
    std::vector<int64_t> shares;
    std::optional<ShareBalancer> balancer;
    /// The gradient accumulators' storage: Learner::gradients are views into these flat buffers,
    /// so the all-reduce sums them in place, a few large tensors instead of one per parameter.
    std::vector<torch::Tensor> buckets;
    bool sharedByCapacity = false;  ///< the shares follow every rank's probed micro-batch
    int oomsInStep = 0;             ///< this rank's recovered OOMs in the current step
    int64_t lastCheckedStep = -1;   ///< step of the last parameter comparison
    bool stoppedByRanks = false;    ///< the run ended because a rank asked to stop
    /// A target batch change asked for on this rank, waiting for the ranks to agree on it.
    std::optional<std::pair<int64_t, LrScaling>> requestedTarget;
    /// Memory savers asked for on this rank, waiting for the ranks to agree on them.
    std::optional<MemorySavers> requestedSavers;
    bool surveyRequested = false;  ///< a survey of the memory savers asked for on this rank
    /// Device switches asked for on this rank (by the rank that is to move), and an equivalence
    /// check (its samples; 0: the whole batch), waiting for the ranks to agree on them.
    std::map<int, std::string> requestedDevices;
    std::optional<int64_t> requestedEquivalence;
    int64_t switches = 0;            ///< device switches agreed so far: names each one's keys in the store
    int64_t equivalenceChecks = 0;   ///< equivalence checks agreed so far: the same
    std::vector<int64_t> lastBatch;  ///< the last training batch, every rank's samples (the equivalence check's)
    /// Where each rank could use NCCL (ProcessGroupLink::ncclPlace: its host, empty: it cannot),
    /// and why Gloo sums the gradients when it does.
    std::vector<std::string> places;
    std::string collectivesWhy;
    /// BatchNorm's running statistics (their indices in the model's buffers): each rank's see
    /// only its share of a batch, so after every step each rank keeps their average over the
    /// ranks, weighted by share: the same on every rank, from every sample of the batch.
    std::vector<size_t> statistics;
    /// The ranks that voted to pause at this batch boundary (ranksAgree), for holdWhilePaused.
    std::vector<int> pausingRanks;
    int64_t pauses = 0;   ///< pauses agreed so far: names each one's key in the store
    RanksStepped report;  ///< the current step's, filled by reduceOverRanks
    /// This rank's probe and OOM events since the last step's exchange (ranks other than 0),
    /// which rank 0 receives with the step (reduceOverRanks) and emits as RankProbed.
    std::vector<Event> unreported;
    int64_t reportExchanges = 0;  ///< names each exchange of those reports in the store
};

}  // namespace trainer_detail

using namespace trainer_detail;

/// Thrown by setup when the user stopped the run while the data was loading.
struct LoadingCancelled {};

struct Trainer::Impl {
    Impl(TrainerOptions o, EventSink& s) : options(std::move(o)), sink(s), commands(options.stepMode) {}

    TrainerOptions options;
    EventSink& sink;

    CommandMailbox commands;  ///< posted from any thread, taken by the run thread

    // The run's state, in parts: touched by the run thread only.
    Progress progress;  ///< the clock, state, step, samples and target batch
    Feed feed;          ///< the training and held-out data, the sampler and the prefetcher
    Learner learner;    ///< the model, its gradients, the optimizer, the savers and loss scale
    Hardware hardware;  ///< the device, its meter and what the memory reports said
    /// How the micro-batch size is chosen: the sizes in use, the probe, the fastest-size timing,
    /// the drift watch and the step costs (core/plan/size_choice.h, torch-free).
    SizeChoice choice;
    /// Several devices: the job this rank belongs to (null: one process trains every batch).
    std::optional<ParallelState> parallel;
    Checkpointer checkpointer{options.checkpoint};  ///< the folder, when to save, the best model so far

    double now() const { return std::chrono::duration<double>(Clock::now() - progress.start).count(); }
    /// What micro-batches and training batches are timed with (TrainerOptions::timingClock).
    Clock::time_point timingNow() const { return options.timingClock ? options.timingClock() : Clock::now(); }
    void emit(Event event) {
        if (auto* failed = std::get_if<OomEvent>(&event)) failed->snapshotFile = snapshotAtOom();
        if (parallel) {
            if (std::holds_alternative<OomEvent>(event)) ++parallel->oomsInStep;
            // Rank 0 shows every rank's probes and OOMs: the others send theirs with the step.
            if (parallel->link->rank() != 0 && isRankReported(event)) parallel->unreported.push_back(event);
        }
        const bool oom = std::holds_alternative<OomEvent>(event);
        sink.onEvent(event);
        if (oom) reportFailureSegments();
    }
    /// This process keeps the checkpoints and evaluates: the only one, or rank 0 of several.
    bool leads() const { return !parallel || parallel->link->rank() == 0; }
    void setState(RunState s, std::string detail = {}) {
        progress.state = s;
        emit(RunStateChanged{now(), s, std::move(detail)});
    }
    int64_t usableBytes() const {
        return static_cast<int64_t>(static_cast<double>(hardware.meter->capacity()) * (1.0 - options.probe.headroom));
    }
    /// The rest of a batch split for training (MicroBatchSizes::planFor).
    std::vector<int64_t> planFor(int64_t remaining, int64_t micro) const {
        return choice.sizes().planFor(remaining, micro);
    }
    /// The samples of a training batch this process trains: the target batch, or with several
    /// devices this rank's share of it.
    int64_t localTarget() const {
        return parallel ? parallel->shares[static_cast<size_t>(parallel->link->rank())] : progress.target;
    }
    int64_t upperBound() const {
        int64_t bound = std::min(localTarget(), feed.training->size());
        if (options.probe.maxMicroBatch > 0) bound = std::min(bound, options.probe.maxMicroBatch);
        return bound;
    }
    /// Whichever limit comes first ends the run; with neither it runs until stopped.
    bool limitReached() const {
        if (options.steps && progress.step >= *options.steps) return true;
        return options.epochs && feed.sampler->completedEpochs() >= *options.epochs;
    }
    /// The step limit for progress displays; 0 when the run is unbounded.
    int64_t totalSteps() const {
        int64_t total = options.steps.value_or(0);
        if (options.epochs) {
            const int64_t byEpochs =
                *options.epochs * ((feed.training->size() + progress.target - 1) / progress.target);
            total = total > 0 ? std::min(total, byEpochs) : byEpochs;
        }
        return total;
    }

    void setup();
    // setup's parts.
    /// The training data and the validation data (held out or given), on the host.
    void loadData();
    /// What the data and the checkpoint options must agree on, found before any training: a
    /// FatalError naming the option to change.
    void checkDataAndCheckpoints() const;
    /// The model, its gradient accumulators and the optimizer on the device (counted).
    void buildModel();
    /// The memory savers asked for work with this model and device (FatalError where not).
    void checkSaversSuitModel() const;
    /// Trains batch after batch, validating when due, until a limit is reached or the run is
    /// stopped (Trainer::run).
    void trainUntilDone();
    /// The end of a run that did not fail: the ranks' last comparison, an equivalence check asked
    /// for during the last batch, the last validation and checkpoint; `result.stopped` set.
    void endRun(RunResult& result);
    /// A validation pass is due after this step: every validation.every_steps steps, or when an
    /// epoch was completed since the last one.
    bool validationDue() const;
    /// Evaluates the held-out data and reports ValidationDone (trainer_validation.cpp).
    void runValidation();
    /// A validation micro-batch of `size` samples from `offset` threw `error`: after an OOM the
    /// pass goes on at a smaller size (reported); anything else, or an OOM one sample at a time,
    /// ends the run (FatalError).
    void validationFailed(const std::exception_ptr& error, int64_t size, int64_t offset);
    /// One validation micro-batch added to `totals`; the error (an OOM among them) it raised, if any.
    std::exception_ptr evaluate(const std::vector<int64_t>& indices, ValidationTotals& totals);
    void sampleMemory(bool force);
    /// Reports the memory breakdown, and the allocator's segments when they changed.
    void reportBreakdown();
    /// AllocatorSegments at the allocator's OOM, once per OOM it raised (after the OomEvent).
    void reportFailureSegments();
    /// Writes the allocator's segments as its latest OOM left them into the run folder, as a
    /// memory_viz pickle, once per OOM it raised in this run and at most kMaxOomSnapshots times;
    /// returns the file's name in the folder (empty: none written).
    std::string snapshotAtOom();
    /// A meter was opened: segments, failures and allocator retries are reported from here on.
    void meterOpened();
    void reportSummary();
    /// Reports EquivalenceChecked (trainer_equivalence.cpp). With several devices every rank
    /// runs it at the same batch (agreed in ranksAgree): the check batch is split over the ranks
    /// as training splits it, each accumulates its part with its own micro-batch plan, the parts
    /// are summed over the ranks, and rank 0 compares the sum with one full pass and reports it.
    void checkEquivalence(int64_t samples);
    // checkEquivalence's parts.
    struct CheckBatch {
        std::vector<int64_t> indices;  ///< the check batch (every rank's samples)
        std::vector<int64_t> part;     ///< this rank's part of it
        int64_t samples = 0;
        int64_t microBatch = 0;  ///< the size training uses now (0: none known yet)
        std::string problem;     ///< why the check cannot go on; empty: it can
    };
    /// The samples to check (the last training batch's first `requested`) and this rank's plan.
    CheckBatch chooseCheckBatch(int64_t requested, EquivalenceChecked& r);
    /// The accumulated gradient of this rank's part, in training mode (and, for a BatchNorm
    /// model, in evaluation mode too); sets `check.problem` where it cannot be computed.
    std::vector<std::vector<torch::Tensor>> accumulateForCheck(CheckBatch& check, const EquivalenceChecked& r);
    /// Several devices: every rank's plan and problem, and the sum of the parts.
    void sumCheckOverRanks(CheckBatch& check, EquivalenceChecked& r,
                           std::vector<std::vector<torch::Tensor>>& accumulated);
    /// One full pass over the check batch, compared with the accumulated gradients.
    void compareWithFullBatch(const CheckBatch& check, EquivalenceChecked& r,
                              const std::vector<std::vector<torch::Tensor>>& accumulated);
    /// Runs `pass`; one that runs out of memory on a host device (cpu, virtual) is repeated
    /// outside the budget (the budget simulates a GPU, and the check is not training), setting
    /// `*outside`. On a GPU it is an error with advice.
    std::vector<torch::Tensor> checkPass(const CheckBatch& check,
                                         const std::function<std::vector<torch::Tensor>()>& pass, bool* outside);
    /// The gradient of `indices` accumulated by training's own code (runMicroBatch into the
    /// accumulators) in micro-batches of `microBatchSizes`, each weighted by its share of
    /// `batchSize` samples (several devices: the whole check batch, of which `indices` is this
    /// rank's part); training's state is left as it was.
    std::vector<torch::Tensor> accumulateAsTraining(const std::vector<int64_t>& indices,
                                                    const std::vector<int64_t>& microBatchSizes, int64_t batchSize);
    /// L2 norm of the accumulated gradients (uncounted: a few scalars).
    double gradientNorm() const {
        torch::NoGradGuard noGrad;
        CountingScope scalars(false);
        // One norm per tensor, then the norm of those: no copies, one synchronisation.
        std::vector<torch::Tensor> norms;
        norms.reserve(learner.gradients.size());
        for (const auto& g : learner.gradients) norms.push_back(g.norm());
        return torch::stack(norms).norm().item<double>();
    }
    void startProbe(ProbeReason reason, int64_t initial, int64_t knownFit);
    void finishProbe();
    /// Starts timing sizes up to `largest` (objective "fastest"; otherwise nothing); `warmSize`
    /// just ran (the probe's last trial), so it needs no warm-up.
    void startTiming(int64_t largest, int64_t warmSize = 0);
    /// Ends the timing: training uses `size` (the search's choice unless an OOM lowered it).
    void finishTiming(int64_t size);
    /// The search decided: check a size below the largest on whole batches first, else decide.
    void searchDecided();
    /// The commands posted since the last batch, applied at this batch boundary; false when the
    /// run is to stop.
    bool applyCommands();
    // applyCommands' parts; each true when it started a probe.
    /// Several devices: what every rank must apply at the same batch goes to the ranks' vote
    /// (ranksAgree) and is taken out of `asked`. Returns this process's device switch, if any (a
    /// rank the job does not have is warned about).
    std::optional<std::string> routeCommands(CommandMailbox::Batch& asked);
    bool switchDeviceAsked(const std::string& spec);
    /// A target batch larger than the data is refused with a warning.
    bool applyTargetAsked(const std::optional<std::pair<int64_t, LrScaling>>& asked);
    /// New memory savers, or a survey of them (asked for, or due after a probe: finishProbe).
    bool applySaversAsked(std::optional<MemorySavers> asked, bool survey);
    bool waitWhilePaused();
    /// Trains `indices` and takes the optimizer step. `batchSize`: the whole training batch's
    /// size, which weights each micro-batch (size / batchSize); with several devices `indices`
    /// is this rank's share of it, and the gradients are summed over the ranks before the step.
    void trainBatch(const std::vector<int64_t>& indices, int64_t batchSize);
    // trainBatch's parts, in the order a batch meets them.
    /// Trains the batch's micro-batches into the gradient accumulators; false when the run was
    /// stopped or paused in the middle (the caller drops the partial batch).
    bool accumulate(BatchPass& pass, const std::vector<int64_t>& indices, int64_t batchSize);
    // accumulate's parts.
    /// The samples to load while a micro-batch of `size` computes: the plan's next micro-batch,
    /// where it is known and loading ahead pays (loadsAhead); none during a probe.
    std::vector<int64_t> nextToLoad(const BatchPass& pass, const std::vector<int64_t>& indices, int64_t size,
                                    bool trial) const;
    /// A micro-batch of `slice` succeeded: the probe or the timing learns from it, it is reported
    /// (MicroBatchDone) and counted in `pass`.
    void commitMicroBatch(BatchPass& pass, const MicroResult& r, const std::vector<int64_t>& slice, double weight,
                          int64_t batchSize, bool trial, int64_t localSize);
    /// The next micro-batch to train (SizeChoice::next decides; always of kind Train): the probe's
    /// trial or the plan's next size for the `remaining` samples; nullopt when the probe ended or
    /// the memory savers changed first (choose again).
    std::optional<SizeChoice::Next> chooseMicroBatch(BatchPass& pass, int64_t remaining);
    /// A micro-batch failed: after an OOM, the batch starts over where backward left partial
    /// gradients, and the micro-batch shrinks (or the probe learns, or the memory savers change);
    /// any other error ends the run (FatalError), explained (core/train/failure_explanation.h).
    void afterFailure(BatchPass& pass, const MicroResult& r, int64_t size, bool trial);
    /// BatchNorm refused a single sample: micro-batches hold at least 2 from now on.
    void learnTwoSampleMinimum(BatchPass& pass, bool trial);
    void shrinkAfterOom(BatchPass& pass, const MicroResult& r, int64_t size, bool trial, int64_t redone);
    /// Stopped mid-batch (paused, step mode) or a batch trained again: the partial gradients are
    /// dropped, the buffers put back as the batch found them; the model keeps its last step.
    void dropPartialBatch(BatchPass& pass);
    /// The batch from its first sample again (the same samples, the same weights); returns the
    /// samples that are trained again.
    int64_t startOver(BatchPass& pass);
    /// float16 overflow: half the loss scale (the batch is then trained again); a FatalError
    /// below kMinLossScale.
    void halveLossScale(int64_t samples);
    /// The optimizer step and what follows it: the loss scale's growth, the step's events, the
    /// fastest size's drift watch, checkpoints, a regrow after an OOM shrink.
    void finishStep(const BatchPass& pass, const std::vector<int64_t>& indices, int64_t batchSize,
                    Clock::time_point stepStart, double computeSeconds, int64_t plannedLocal);
    void warnAboutAllocatorRetries();
    /// Sets the target batch to `next`, the learning rate scaled by `rule`, and probes again
    /// unless a probe runs; true when it started one.
    bool changeTarget(int64_t next, LrScaling rule);
    // Several devices (trainer_parallel.cpp).
    /// Joins the job: refuses what it cannot do, gives every rank rank 0's parameters, learns the
    /// ranks' devices, keeps the gradients in buckets and splits the target by usable memory.
    void setupParallel();
    /// At a batch boundary, every rank together: whether to stop (any rank asked to), the
    /// target batch change asked for (the lowest rank's that asked), applied by all of them, and
    /// which ranks asked to pause (ParallelState::pausingRanks).
    bool ranksAgree(bool stopHere);
    /// Every rank's vote for the next batch (ranksAgree), rank by rank; this rank's requests are
    /// cleared once sent.
    std::vector<RankVote> gatherVotes(bool stopHere);
    /// A target batch change the ranks agreed on: the shares scaled to it, or a warning where
    /// the devices cannot share it.
    void agreeOnTarget(const std::pair<int64_t, LrScaling>& asked);
    /// After ranksAgree, when ranks asked to pause: each of them waits until it is resumed (or
    /// stopped), then says so in the store; every rank waits for all of them, as long as they
    /// live (a pause may outlast any collective's timeout). False when no rank paused.
    bool holdWhilePaused();
    /// The gradient accumulators become views into a few flat buckets (zero, as at a batch
    /// boundary), so the all-reduce works in place on large tensors; after a switch, on the new device.
    void bucketGradients();
    /// NCCL when every rank is on a GPU of its own and can use it, else Gloo (chooseCollectives);
    /// every rank alike, at the start and after a device switch. A new NCCL communicator forms at
    /// once (an all-reduce of the zero buckets), not in the middle of the next step.
    void chooseRankCollectives();
    /// A device switch agreed in ranksAgree: every rank learns the switches asked for, the ranks
    /// named move and probe again, and every rank learns the ranks' devices (or why one stayed).
    void switchRanks();
    /// switchRanks' end: every rank's device as each said it (`outcome`, by rank), and rank 0
    /// reports the switches and refusals of the others; true when any rank moved.
    bool learnRankDevices(const std::vector<std::string>& outcome);
    /// What several devices cannot do (step mode, a target batch too small to share): a
    /// FatalError, alike on every rank before any joins.
    void refuseWhatRanksCannotDo(int world) const;
    /// The end of a run: an equivalence check asked for on any rank during the last batch (its
    /// samples), which every rank then runs together; none when a rank was stopped.
    std::optional<int64_t> agreeOnEquivalence(std::optional<int64_t> mine, bool stopped);
    /// This rank's part of a training batch.
    std::vector<int64_t> rankSlice(const std::vector<int64_t>& batch) const;
    /// After this rank's micro-batches: exchanges the ranks' numbers, sums the gradients and the
    /// loss over the ranks, reports RanksStepped and chooses the next shares. Returns the loss
    /// of the whole batch.
    double reduceOverRanks(double lossSum, int64_t share, int64_t largestUsed, int64_t committed, int64_t peak,
                           double computeSeconds, bool settled);
    // reduceOverRanks' parts.
    /// Every rank's step numbers (`mine`: this rank's), the gradient sum in place, BatchNorm's
    /// statistics averaged by share, and the other ranks' probe reports where any has some.
    std::vector<double> sumOverRanks(const std::vector<double>& mine, int64_t share, double& reduceSeconds,
                                     std::vector<std::string>& reports);
    /// Rank 0: the other ranks' probes and OOMs as RankProbed events.
    void showRankReports(const std::vector<std::string>& reports);
    /// The step's RanksStepped report and the next shares, decided alike on every rank from the
    /// same numbers; returns the loss of the whole batch.
    double recordRanksStep(const std::vector<double>& all, double reduceSeconds);
    /// After the optimizer step: compares the ranks' parameters when due, reports RanksStepped
    /// and applies the next shares (from the next batch on).
    void finishRanksStep();
    /// A rank other than 0, where rank 0 validates after this step: waits until it is done, as
    /// long as rank 0 lives (ProcessGroupLink::waitWhileAlive), and counts the pass as its own.
    void awaitValidation();
    /// Compares a checksum of every rank's parameters (once per step); a difference stops the run.
    void checkRanksAgree();
    /// A collective failed: the message, naming the ranks that did not get to `step`.
    [[noreturn]] void ranksFailed(const std::exception& error, const std::string& during);
    /// `next`: the micro-batch after this one, when known; it is requested from the prefetcher
    /// once this one's samples are taken (requesting it earlier would replace this one's load).
    /// `measurement` true: the model's buffers are put back afterwards (surveySavers, which also
    /// puts back the accumulators). `buffersBefore`: where a micro-batch that succeeded leaves its
    /// copy of the buffers as they were before it (the first of a batch: the batch's start).
    MicroResult runMicroBatch(const std::vector<int64_t>& indices, double weight, std::vector<int64_t> next = {},
                              bool measurement = false, std::vector<torch::Tensor>* buffersBefore = nullptr);
    // runMicroBatch's parts.
    /// The micro-batch's samples to the device, forward, the loss, and backward into the
    /// accumulators weighted by `weight` (`result` filled as it goes; `savedBuffers`: the buffers
    /// before it). Throws what the model or the device threw.
    void forwardBackward(const std::vector<int64_t>& indices, double weight, std::vector<int64_t> next,
                         MicroResult& result, std::vector<torch::Tensor>& savedBuffers);
    /// The micro-batch of `size` samples threw `error`: what it was, and after an OOM the device
    /// and the model's buffers as they were before it.
    void afterMicroBatchError(const std::exception_ptr& error, int64_t size, MicroResult& result,
                              const std::vector<torch::Tensor>& savedBuffers);
    /// Makes each parameter's .grad its accumulator in `gradients`, where backward adds in place
    /// (an undefined accumulator unlinks it); call after `parameters` or `gradients` change.
    void linkGradients();
    /// Copies of the model's buffers (counted: they take device memory), and putting them back.
    std::vector<torch::Tensor> copyBuffers() const;
    void restoreBuffers(const std::vector<torch::Tensor>& saved);
    void optimizerStep();
    /// Moves to `next` (and reports DeviceSwitched), then probes there from the size in use;
    /// what stood in the way when it cannot.
    std::optional<std::string> switchTo(const DeviceSpec& next);
    /// Saves the latest checkpoint in options.checkpoint.directory; with `metric`, the best model
    /// so far (its `value` on that validation metric) in the directory's best/ folder.
    void writeCheckpoint(const std::string& metric = {}, double value = 0);
    /// After a validation pass: saves the model as the best so far when `done` beats every earlier
    /// pass on options.checkpoint.keepBest (strictly: a tie keeps the earlier model).
    void keepBestModel(const ValidationDone& done);
    /// Model, optimizer and trainer state from options.resumeFrom (setup, after the model exists).
    void restoreCheckpoint();
    /// The resumed checkpoint was written on this run's data, with its seed and loss: a
    /// FatalError naming the setting and both values where not. A learning rate other than the
    /// checkpoint's is said (a Warning): the checkpoint's goes on.
    void checkResumedRun(const TrainerState& resumed);
    /// The resumed checkpoint's sample counts (the training set's, the sampler's position, the
    /// target batch) fit this run's training data: a FatalError where not.
    void checkResumedSamples(const TrainerState& resumed);
    void releaseFailedBackward();
    /// Stops the run: the model does not fit. Where a memory saver would help (not during setup,
    /// nor for the optimizer state: `suggestSavers` false) the message names the one that makes
    /// the smallest micro-batch fit fastest, measured (surveySavers).
    [[noreturn]] void doesNotFit(int64_t requested, bool duringSetup = false, bool suggestSavers = true);
    /// The caching allocator's latest OOM in this run (its reserved bytes, the segment it tried to
    /// add); empty where the meter knows none (exact counting, the CPU).
    AllocationFailure cachingFailure() const;
    void useMemorySavers(MemorySavers next);
    /// The forward pass's autocast for the savers in use: bfloat16, float16, or off.
    AutocastState forwardAutocast() const {
        if (autocastsFp16(learner.savers)) return {true, c10::ScalarType::Half};
        return {autocastsBf16(learner.savers), c10::ScalarType::BFloat16};
    }
    /// What backward's loss is multiplied by: the loss scale under float16 autocast, else 1.
    double backwardScale() const { return autocastsFp16(learner.savers) ? learner.lossScaler.scale() : 1.0; }
    /// float16 autocast, before the optimizer step: true when every gradient of the batch is
    /// finite, which are then divided by the loss scale; false (gradients untouched) on overflow.
    bool unscaleGradients();
    /// Why float16 autocast cannot run on this device with this LibTorch; empty: it can.
    std::string float16Unavailable() const;
    /// memory_savers auto, when nothing fits at the smallest micro-batch: measures every saver
    /// (surveySavers) and turns on the fastest that fits and was not tried yet, says so, and starts
    /// a probe. False when none is left, or the option is not auto: the caller stops the run
    /// (doesNotFit).
    bool nextMemorySavers(int64_t requested);
    /// Measures every memory saver on the model, the device and the data's first samples
    /// (core/plan/saver_survey.h decides the sizes and predicts), reports SaverSurvey and returns it.
    /// Nothing changes: the savers in use, the model's statistics, the batch's gradients and the
    /// CPU's random stream are as before.
    SaverSurvey surveySavers(const std::string& reason);
    /// surveySavers' measurement of one saver: micro-batches of the sizes nextSurveySize asks
    /// for, trained with `candidate` on (left on), and what predictSaver makes of them.
    SaverOption measureSaver(MemorySavers candidate);
    /// Uses `next` from now on: reports MemorySaversChanged (`why`) and starts a probe from the
    /// last survey's prediction. False (with a Warning where it is refused) when nothing changed.
    bool applySavers(MemorySavers next, const std::string& why);
    /// Why the loss is not finite: the data, the model before any update, or divergence.
    std::string nonFiniteLossReason(double loss, const torch::Tensor& inputs, const torch::Tensor& output,
                                    const torch::Tensor& targets) const;
};

}  // namespace batchpilot::core
