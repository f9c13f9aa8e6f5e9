#include "core/trainer.h"

#include <chrono>
#include <functional>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "core/accumulation_plan.h"
#include "core/byte_size.h"
#include "core/checkpoint.h"
#include "core/math_libraries.h"
#include "core/cuda_meter.h"
#include "core/counting_allocator.h"
#include "core/dataset.h"
#include "core/device.h"
#include "core/cancel.h"
#include "core/equivalence.h"
#include "core/loss.h"
#include "core/model.h"
#include "core/model_factory.h"
#include "core/oom.h"
#include "core/optimizer.h"
#include "core/prefetcher.h"
#include "core/probe_search.h"
#include "core/sampler.h"
#include "core/text_format.h"

namespace batchpilot::core {
namespace {

using Clock = std::chrono::steady_clock;

/// BatchNorm's refusal of one value per channel in training (LibTorch's C++ and TorchScript
/// batch_norm both word it so).
bool needsTwoSamples(const std::string& message) {
    return message.find("Expected more than 1 value per channel when training") != std::string::npos;
}

/// The torch device a DeviceSpec's tensors live on (virtual devices are the CPU).
torch::Device torchDevice(const DeviceSpec& device) {
    return device.kind == DeviceKind::Cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index))
                                           : torch::Device(torch::kCPU);
}

/// OOMs in a row at micro-batch 1 before the model is declared too big for the device.
constexpr int kSingleSampleRetries = 2;

/// A run-ending error with a message for the user (not retried).
struct FatalError {
    std::string message;
    std::string where;
};

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
    int64_t peakBytes = 0;
    int64_t residentBytes = 0;  ///< allocated when the micro-batch started
    double seconds = 0;
};

/// The micro-batch with the highest peak in a step, for the memory breakdown.
struct PeakRecord {
    int64_t resident = 0;
    int64_t peak = 0;
    int64_t size = 0;
    void offer(int64_t residentBytes, int64_t peakBytes, int64_t microBatch) {
        if (peakBytes > peak) *this = {residentBytes, peakBytes, microBatch};
    }
};

}  // namespace

/// Thrown by setup when the user stopped the run while the data was loading.
struct LoadingCancelled {};

struct Trainer::Impl {
    Impl(TrainerOptions o, EventSink& s) : options(std::move(o)), sink(s) { stepMode = options.stepMode; }

    TrainerOptions options;
    EventSink& sink;

    // Commands, set from any thread, applied by the run thread.
    std::mutex mutex;
    std::condition_variable wake;
    bool stopRequested = false;
    /// Set with stopRequested; read without the lock by the data loaders (core/cancel.h).
    std::atomic<bool> cancelLoading{false};
    bool pauseRequested = false;
    std::optional<std::pair<int64_t, LrScaling>> pendingTarget;
    bool pendingReprobe = false;
    std::optional<std::string> pendingDevice;
    bool stepMode = false;           ///< step-by-step: wait before each micro-batch
    int64_t advanceTokens = 0;       ///< micro-batches the user allowed to run
    bool finishingBatch = false;     ///< run the rest of the current batch without waiting
    std::optional<int64_t> pendingEquivalence;

    // Run state: touched by the run thread only.
    Clock::time_point start = Clock::now();
    std::shared_ptr<Dataset> data;
    std::unique_ptr<Prefetcher> prefetcher;  ///< loads the next micro-batch during this one
    std::shared_ptr<Model> model;
    std::unique_ptr<Optimizer> optimizer;
    DeviceSpec device;
    std::unique_ptr<MemoryMeter> meter;
    std::vector<torch::Tensor> parameters;
    std::vector<torch::Tensor> gradients;  ///< accumulated, weighted gradients of the batch
    torch::Tensor reservation;            ///< optimizer state held back during the first probe
    std::optional<Sampler> sampler;
    int64_t target = 0;
    int64_t microBatch = 0;       ///< 0 until the first probe finishes
    int64_t probedMicroBatch = 0; ///< result of the last probe (regrow target)
    /// Smallest micro-batch the model can train on: 2 once BatchNorm refused a single sample
    /// (a 1x1 feature map leaves it one value per channel).
    int64_t minMicroBatch = 1;
    /// Smallest part the rest of a batch is split into, never below minMicroBatch: 2 for
    /// BatchNorm models from the start (one sample normalised alone is useless even where
    /// BatchNorm accepts it).
    int64_t minPart = 1;
    ProbeReason currentProbeReason = ProbeReason::Initial;
    std::optional<ProbeSearch> probe;
    int probeSequence = 0;
    Clock::time_point probeStart;
    int64_t step = 0;
    int64_t samplesSeen = 0;
    int cleanStepsSinceShrink = -1;
    int singleSampleOoms = 0;  ///< consecutive OOMs at micro-batch 1  ///< -1: no shrink pending a regrow
    double lastMemorySample = -1;
    RunState state = RunState::Idle;
    std::vector<int64_t> lastBatch;  ///< indices of the last committed training batch
    // Memory breakdown, measured by the meter at the points named in MemoryBreakdown.
    int64_t parameterBytes = 0;
    int64_t gradientBytes = 0;
    int64_t optimizerStateBytes = 0;
    PeakRecord lastPeak;             ///< the last step's highest micro-batch peak

    double now() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
    void emit(Event event) { sink.onEvent(event); }
    void setState(RunState s, std::string detail = {}) {
        state = s;
        emit(RunStateChanged{now(), s, std::move(detail)});
    }
    int64_t usableBytes() const {
        return static_cast<int64_t>(static_cast<double>(meter->capacity()) * (1.0 - options.probe.headroom));
    }
    /// The rest of a batch split for training (AccumulationPlan::split), with a last part below
    /// minPart merged into the one before it (only possible at micro-batch 2: 2+1 -> 3).
    std::vector<int64_t> planFor(int64_t remaining, int64_t micro) const {
        std::vector<int64_t> sizes = AccumulationPlan::split(remaining, micro);
        if (sizes.size() >= 2 && sizes.back() < minPart) {
            sizes[sizes.size() - 2] += sizes.back();
            sizes.pop_back();
        }
        return sizes;
    }
    int64_t upperBound() const {
        int64_t bound = std::min(target, data->size());
        if (options.probe.maxMicroBatch > 0) bound = std::min(bound, options.probe.maxMicroBatch);
        return bound;
    }
    /// Whichever limit comes first ends the run; with neither it runs until stopped.
    bool limitReached() const {
        if (options.steps && step >= *options.steps) return true;
        return options.epochs && sampler->completedEpochs() >= *options.epochs;
    }
    /// The step limit for progress displays; 0 when the run is unbounded.
    int64_t totalSteps() const {
        int64_t total = options.steps.value_or(0);
        if (options.epochs) {
            const int64_t byEpochs = *options.epochs * ((data->size() + target - 1) / target);
            total = total > 0 ? std::min(total, byEpochs) : byEpochs;
        }
        return total;
    }

    void setup();
    void sampleMemory(bool force);
    void reportBreakdown();
    void reportSummary();
    bool waitForAdvance(const StepModeWaiting& next);
    bool stepModeOn() {
        std::lock_guard lock(mutex);
        return stepMode;
    }
    void checkEquivalence(int64_t samples);
    /// The gradient of `indices` accumulated by training's own code (runMicroBatch into the
    /// accumulators) in micro-batches of `microBatchSizes`; training's state is left as it was.
    std::vector<torch::Tensor> accumulateAsTraining(const std::vector<int64_t>& indices,
                                                    const std::vector<int64_t>& microBatchSizes);
    /// L2 norm of the accumulated gradients (uncounted: a few scalars).
    double gradientNorm() const {
        torch::NoGradGuard noGrad;
        CountingScope scalars(false);
        // One norm per tensor, then the norm of those: no copies, one synchronisation.
        std::vector<torch::Tensor> norms;
        norms.reserve(gradients.size());
        for (const auto& g : gradients) norms.push_back(g.norm());
        return torch::stack(norms).norm().item<double>();
    }
    void startProbe(ProbeReason reason, int64_t initial, int64_t knownFit);
    void finishProbe();
    bool applyCommands();
    bool waitWhilePaused();
    void trainBatch(const std::vector<int64_t>& indices);
    /// `next`: the micro-batch after this one, when known; it is requested from the prefetcher
    /// once this one's samples are taken (requesting it earlier would replace this one's load).
    MicroResult runMicroBatch(const std::vector<int64_t>& indices, double weight, std::vector<int64_t> next = {});
    void optimizerStep();
    void switchTo(const DeviceSpec& next);
    void writeCheckpoint();
    void releaseFailedBackward();
    std::string checkpointError;  ///< the last failed save's message
    int64_t allocatorRetriesSeen = 0;  ///< the meter's allocator retries already reported
    [[noreturn]] void doesNotFit(int64_t requested, bool duringSetup = false);
    /// Why the loss is not finite: the data, the model before any update, or divergence.
    std::string nonFiniteLossReason(double loss, const torch::Tensor& inputs, const torch::Tensor& output,
                                    const torch::Tensor& targets) const;
};

void Trainer::Impl::setup() {
    auto checked = validate(options);
    if (!checked) throw FatalError{checked.error(), "configuration"};
    auto parsed = parseDevice(options.device);
    if (!parsed) throw FatalError{parsed.error(), "configuration"};
    device = *parsed;
    torch::set_num_threads(intraOpThreadsFor(options.intraOpThreads, options.reservedCpus));
    {
        // The dataset lives in host memory: it does not count against the device.
        CountingScope host(false);
        CancelScope cancellable(cancelLoading);
        auto made = options.datasetFactory ? options.datasetFactory() : makeDataset(options.data);
        if (!made && cancelLoading.load()) throw LoadingCancelled{};
        if (!made) throw FatalError{made.error(), "dataset"};
        data = *made;
    }
    if (data->size() <= 0) throw FatalError{"the dataset \"" + data->name() + "\" is empty", "dataset"};
    if (options.loss == LossKind::CrossEntropy && !options.data.regression && data->classes() < 2) {
        throw FatalError{"the data " + data->name() + " has a single class: a classifier learns nothing from it (its loss "
                         "is 0 from the start); give data with at least two classes, or train a regression (--loss mse)",
                         "dataset"};
    }
    // Resumed runs check the checkpoint's target below.
    if (options.resumeFrom.empty() && options.targetBatch > data->size()) {
        throw FatalError{"the target batch " + std::to_string(options.targetBatch) + " is larger than the data: " +
                             data->name() + " has " + std::to_string(data->size()) +
                             " samples, and a training batch uses each sample at most once; choose a target batch of at most " +
                             std::to_string(data->size()),
                         "configuration"};
    }
    if (!options.checkpoint.directory.empty()) {
        // Found out now, not after hours of training: a checkpoint folder that cannot be written.
        if (auto writable = checkCheckpointDirectory(options.checkpoint.directory); !writable) {
            throw FatalError{writable.error(), "checkpoint"};
        }
    }
    for (const std::string& warning : data->warnings()) emit(Warning{now(), warning});
    prefetcher = std::make_unique<Prefetcher>(data);
    if (device.kind == DeviceKind::Cuda && options.cudaMemoryFraction > 0) {
        setCudaMemoryFraction(device.index, options.cudaMemoryFraction);
    }
    meter = openMeter(device);
    meter->resetPeak();
    allocatorRetriesSeen = meter->allocatorRetries();
    target = options.targetBatch;
    sampler.emplace(data->size(), options.seed);
    try {
        torch::manual_seed(options.seed);
        // Parameters and gradient accumulators are measured as what they add on the device.
        const int64_t beforeModel = meter->allocated();
        auto made = options.modelFactory ? options.modelFactory(*data) : makeModel(options.model, *data);
        if (!made) throw FatalError{made.error(), "model"};
        model = *made;
        model->to(torchDevice(device));
        model->train(true);
        parameters = model->parameters();
        if (parameters.empty()) throw FatalError{"the model has no trainable parameters", "model"};
        parameterBytes = meter->allocated() - beforeModel;
        gradients.clear();
        for (const auto& p : parameters) gradients.push_back(torch::zeros_like(p));
        gradientBytes = meter->allocated() - beforeModel - parameterBytes;
        optimizer = std::make_unique<Optimizer>(options.optimizer, parameters);
    } catch (const FatalError&) {
        throw;
    } catch (const std::exception&) {
        const FailureInfo failure = classifyFailure(std::current_exception());
        if (failure.outOfMemory) doesNotFit(failure.requestedBytes, /*duringSetup=*/true);
        throw FatalError{"could not build the model: " + failure.message, "model"};
    }
    if (!options.resumeFrom.empty()) {
        const int64_t beforeState = meter->allocated();
        auto resumed = loadCheckpoint(options.resumeFrom, *model, *optimizer);
        if (!resumed) throw FatalError{resumed.error(), "resume"};
        if (optimizer->stateReady()) optimizerStateBytes = std::max<int64_t>(0, meter->allocated() - beforeState);
        step = resumed->step;
        samplesSeen = resumed->samplesSeen;
        sampler->restore(resumed->samplerEpoch, resumed->samplerPosition);
        target = resumed->targetBatch;
        if (resumed->device == device.name()) {
            // Known to fit here: continue without probing; an OOM would still shrink it.
            microBatch = std::min(resumed->microBatch, upperBound());
            probedMicroBatch = microBatch;
        }
        emit(RunStateChanged{now(), RunState::Starting,
                             "resumed from step " + std::to_string(step) + " of " + options.resumeFrom +
                                 ", at the checkpoint's target batch " + std::to_string(target)});
    }
    if (model->usesBatchStatistics()) {
        minPart = 2;
        emit(Warning{now(), "the model uses BatchNorm: each micro-batch is normalised with its own "
                            "statistics, so accumulated gradients differ from full-batch ones; use "
                            "GroupNorm (--norm group) for exact accumulation"});
    }
}

std::string Trainer::Impl::nonFiniteLossReason(double loss, const torch::Tensor& inputs, const torch::Tensor& output,
                                               const torch::Tensor& targets) const {
    torch::NoGradGuard noGrad;
    CountingScope uncounted(false);
    const std::string became = std::string("the loss became ") + (std::isnan(loss) ? "NaN" : "infinite");
    const auto allFinite = [](const torch::Tensor& t) {
        return !t.is_floating_point() || t.isfinite().all().item<bool>();
    };
    if (!allFinite(inputs) || !allFinite(targets)) {
        return became + ": the data itself holds NaN or infinite values in this micro-batch; check the data file";
    }
    if (!allFinite(output)) {
        if (step == 0) {
            return became + ": the model's output is NaN or infinite on finite inputs before any weight was updated, "
                            "so the model itself produces it; check its weights and its forward";
        }
        return became + " at step " + std::to_string(step + 1) + ": the model's outputs overflowed after " +
               std::to_string(step) + " optimizer step(s), which is how training diverges; lower the learning rate "
               "(it is " + formatText("%g", optimizer->learningRate()) + ")";
    }
    return became + " on finite outputs (outputs or targets too large for the loss?); lower the learning rate or "
                    "rescale the data";
}

void Trainer::Impl::doesNotFit(int64_t requested, bool duringSetup) {
    // The peak since the last reset already includes everything that stayed allocated.
    const int64_t needed = std::max(meter->peak() + std::max(requested, meter->lastFailedAllocation()),
                                    meter->lastFailureNeed());
    const std::string what = duringSetup ? "the model's parameters and gradients do not fit on " + device.name()
                                         : "the model does not fit on " + device.name() + " even at micro-batch " +
                                               std::to_string(minMicroBatch);
    // With a large headroom, what fits is the usable part, not the capacity: say which stopped it.
    const bool headroomStopsIt = needed <= meter->capacity() && options.probe.headroom > 0;
    const std::string has = headroomStopsIt
                                ? ", but only " + formatBytes(usableBytes()) + " of its " + formatBytes(meter->capacity()) +
                                      " are usable with headroom " + formatText("%g", options.probe.headroom) +
                                      "; lower the headroom (--headroom), or choose a smaller model or smaller inputs"
                                : ", has " + formatBytes(meter->capacity()) +
                                      "; choose a larger device or budget, a smaller model or smaller inputs";
    throw FatalError{what + ": needs ≈ " + formatBytes(needed) + has,
                     duringSetup ? "setup" : "step " + std::to_string(step + 1)};
}

void Trainer::Impl::sampleMemory(bool force) {
    const double t = now();
    if (!force && t - lastMemorySample < options.memorySampleInterval) return;
    lastMemorySample = t;
    emit(MemorySample{t, meter->allocated(), meter->reserved(), meter->peak(), meter->capacity(), usableBytes()});
}

void Trainer::Impl::reportBreakdown() {
    MemoryBreakdown b;
    b.time = now();
    b.step = step;
    b.device = device.name();
    b.totalBytes = meter->total();
    b.capacityBytes = meter->capacity();
    b.usableBytes = usableBytes();
    b.parameterBytes = parameterBytes;
    b.gradientBytes = gradientBytes;
    b.optimizerStateReserved = !optimizer->stateReady() && reservation.defined();
    b.optimizerStateBytes = optimizer->stateReady() ? optimizerStateBytes
                                                    : (reservation.defined() ? optimizer->stateBytes() : 0);
    if (lastPeak.size > 0) {
        b.residentBytes = lastPeak.resident;
        b.peakBytes = lastPeak.peak;
        b.activationBytes = std::max<int64_t>(0, lastPeak.peak - lastPeak.resident);
        b.activationMicroBatch = lastPeak.size;
    } else {
        // Before any micro-batch: what is resident is the whole story.
        b.residentBytes = meter->allocated();
        b.peakBytes = b.residentBytes;
    }
    b.cacheBytes = std::max<int64_t>(0, meter->reserved() - std::max(b.peakBytes, meter->allocated()));
    b.otherProcessBytes = meter->otherProcesses();
    b.freeBytes = std::max<int64_t>(0, b.totalBytes - b.peakBytes - b.cacheBytes - b.otherProcessBytes);
    emit(std::move(b));
}

void Trainer::Impl::reportSummary() {
    RunSummary summary;
    summary.time = now();
    summary.device = device.name();
    summary.model = model->name();
    summary.parameterCount = model->parameterCount();
    summary.parameterTensors = static_cast<int64_t>(parameters.size());
    summary.dataset = data->name();
    summary.datasetSize = data->size();
    summary.inputShape = data->sampleShape();
    summary.optimizer = std::string(toString(options.optimizer.kind)) + ", learning rate " +
                        formatText("%g", optimizer->learningRate());
    summary.loss = toString(options.loss);
    summary.targetBatch = target;
    summary.batchStatistics = model->usesBatchStatistics();
    emit(std::move(summary));
}

bool Trainer::Impl::waitForAdvance(const StepModeWaiting& next) {
    std::unique_lock lock(mutex);
    if (!stepMode || finishingBatch || stopRequested) return !stopRequested;
    if (advanceTokens > 0) {
        --advanceTokens;
        return true;
    }
    lock.unlock();
    emit(next);
    lock.lock();
    wake.wait(lock, [&] { return !stepMode || advanceTokens > 0 || finishingBatch || stopRequested; });
    if (stepMode && !finishingBatch && advanceTokens > 0) --advanceTokens;
    return !stopRequested;
}

void Trainer::Impl::startProbe(ProbeReason reason, int64_t initial, int64_t knownFit) {
    ProbeOptions probeOptions = options.probe;
    probeOptions.initialMicroBatch = std::max<int64_t>(minMicroBatch, std::min(initial, upperBound()));
    probe.emplace(probeOptions, upperBound(), usableBytes(), std::min(knownFit, upperBound()));
    currentProbeReason = reason;
    ++probeSequence;
    probeStart = Clock::now();
    if (!optimizer->stateReady() && !reservation.defined()) {
        // LibTorch-style optimizers create their state in the first step: hold that much now so
        // the probe does not pick a size that runs out of memory at the first step.
        try {
            reservation = torch::empty({optimizer->stateBytes()}, torch::TensorOptions(torch::kUInt8).device(parameters.front().device()));
        } catch (const std::exception&) {
            const FailureInfo failure = classifyFailure(std::current_exception());
            if (!failure.outOfMemory) throw;
            doesNotFit(failure.requestedBytes);
        }
    }
    setState(RunState::Probing, toString(reason));
    emit(ProbeStarted{now(), probeSequence, reason, device.name(), upperBound(), usableBytes(),
                      reservation.defined() ? optimizer->stateBytes() : 0});
}

void Trainer::Impl::finishProbe() {
    const int64_t found = probe->result();
    if (found <= 0) doesNotFit(0);
    microBatch = found;
    probedMicroBatch = found;
    ProbeFinished done{now(), probeSequence, found, static_cast<int64_t>(planFor(target, found).size()), target, probe->trials(),
                       std::chrono::duration<double>(Clock::now() - probeStart).count(), probe->hitTrialLimit()};
    if (auto fitted = probe->memoryModel()) {
        done.fixedBytes = fitted->fixedBytes;
        done.bytesPerSample = fitted->bytesPerSample;
    }
    if (probe->hitTrialLimit()) {
        emit(Warning{now(), "the probe stopped at its trial limit (" + std::to_string(options.probe.maxTrials) +
                                "); using the largest size that fit, " + std::to_string(found)});
    }
    probe.reset();
    emit(done);
    setState(RunState::Training, "micro-batch " + std::to_string(found));
}

void Trainer::Impl::checkEquivalence(int64_t requested) {
    EquivalenceChecked r;
    r.step = step;
    const auto started = Clock::now();
    const auto finish = [&] {
        r.time = now();
        r.seconds = std::chrono::duration<double>(Clock::now() - started).count();
        meter->releaseCache();
        emit(std::move(r));
    };
    std::vector<int64_t> indices = lastBatch;
    if (indices.empty()) {
        Sampler peek = *sampler;  // before the first step: the batch about to be trained
        indices = peek.next(target);
    }
    if (requested > 0 && requested < static_cast<int64_t>(indices.size())) indices.resize(static_cast<size_t>(requested));
    const auto n = static_cast<int64_t>(indices.size());
    r.samples = n;
    r.batchStatistics = model->usesBatchStatistics();
    const int64_t micro = microBatch > 0 ? microBatch : (probe ? probe->result() : 0);
    if (micro <= 0) {
        r.error = "no micro-batch size is known yet: check again once the probe has chosen one";
        return finish();
    }
    // The current plan; a check batch no larger than the micro-batch is split in up to four
    // micro-batches so that accumulation has something to show.
    r.microBatchSizes = planFor(n, micro < n ? micro : std::max<int64_t>(minPart, (n + 3) / 4));

    /// Restores training mode whatever happens in the BatchNorm comparison.
    struct TrainModeGuard {
        Model& model;
        ~TrainModeGuard() { model.train(true); }
    };
    const torch::Device where = parameters.front().device();
    try {
        Batch host;
        {
            CountingScope uncounted(false);
            host = data->get(indices);
        }
        const torch::Tensor inputs = where.is_cuda() ? host.inputs.to(where) : host.inputs;
        const torch::Tensor targets = where.is_cuda() ? host.targets.to(where) : host.targets;
        // A pass that runs out of memory on a host device (cpu, virtual) is repeated outside the
        // budget: the budget simulates a GPU, and the check is not training. On a GPU it is an
        // error with advice.
        const auto guarded = [&](const std::function<std::vector<torch::Tensor>()>& pass, bool* outside) {
            std::exception_ptr error;
            try {
                return pass();
            } catch (const std::exception&) {
                error = std::current_exception();
            }
            const FailureInfo failure = classifyFailure(error);
            meter->releaseCache();
            if (!failure.outOfMemory) std::rethrow_exception(error);
            if (where.is_cuda()) {
                throw std::runtime_error("the check batch of " + std::to_string(n) + " samples does not fit on " +
                                         device.name() + " in one pass next to the training state; choose a check "
                                         "batch of at most about " + std::to_string(micro) +
                                         " samples (the micro-batch that fits)");
            }
            if (outside != nullptr) *outside = true;
            CountingScope uncounted(false);
            return pass();
        };
        const auto compare = [&](EquivalenceChecked& into) {
            auto accumulated = guarded([&] { return accumulateAsTraining(indices, into.microBatchSizes); }, nullptr);
            auto full = guarded([&] { return fullBatchGradient(*model, inputs, targets, options.loss); },
                                &into.fullPassOutsideBudget);
            compareGradients(model->parameterNames(), accumulated, full, into);
        };
        compare(r);
        if (r.batchStatistics) {
            // Evaluation mode normalises each sample with the running statistics: no sample
            // depends on its neighbours, which isolates what the batch statistics cause.
            TrainModeGuard restore{*model};
            model->train(false);
            EquivalenceChecked running;
            running.microBatchSizes = r.microBatchSizes;
            compare(running);
            r.runningStatisticsRelativeDifference = running.overall.relativeDifference;
        }
        r.explanation = explainEquivalence(r);
    } catch (const std::exception&) {
        const FailureInfo failure = classifyFailure(std::current_exception());
        r.tensors.clear();
        r.error = "the equivalence check could not run: " + failure.message;
    }
    finish();
}

std::vector<torch::Tensor> Trainer::Impl::accumulateAsTraining(const std::vector<int64_t>& indices,
                                                              const std::vector<int64_t>& microBatchSizes) {
    // Training's own path: runMicroBatch adds each micro-batch's weighted gradient to the
    // accumulators, exactly as a step does. What training had there, the buffers (BatchNorm
    // statistics) and the CPU random state are put back afterwards, so training goes on as if
    // the check had not run.
    std::vector<torch::Tensor> kept, buffers;
    {
        torch::NoGradGuard noGrad;
        CountingScope uncounted(false);
        for (auto& g : gradients) {
            kept.push_back(g.clone());
            g.zero_();
        }
        for (const auto& b : model->buffers()) buffers.push_back(b.clone());
    }
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const torch::Tensor randomState = generator.get_state();
    struct Restore {
        Impl& impl;
        std::vector<torch::Tensor>& kept;
        std::vector<torch::Tensor>& buffers;
        at::Generator& generator;
        const torch::Tensor& randomState;
        ~Restore() {
            torch::NoGradGuard noGrad;
            for (size_t i = 0; i < kept.size(); ++i) impl.gradients[i].copy_(kept[i]);
            auto now = impl.model->buffers();
            for (size_t i = 0; i < buffers.size() && i < now.size(); ++i) now[i].copy_(buffers[i]);
            generator.set_state(randomState);
        }
    } restore{*this, kept, buffers, generator, randomState};

    const auto total = static_cast<double>(indices.size());
    size_t offset = 0;
    for (const int64_t size : microBatchSizes) {
        const std::vector<int64_t> slice(indices.begin() + static_cast<std::ptrdiff_t>(offset),
                                         indices.begin() + static_cast<std::ptrdiff_t>(offset + static_cast<size_t>(size)));
        const MicroResult micro = runMicroBatch(slice, static_cast<double>(size) / total);
        if (!micro.ok) {
            if (micro.failure.outOfMemory) C10_THROW_ERROR(OutOfMemoryError, micro.failure.message);
            throw std::runtime_error(micro.failure.message);
        }
        offset += static_cast<size_t>(size);
    }
    std::vector<torch::Tensor> accumulated;
    CountingScope uncounted(false);
    for (const auto& g : gradients) accumulated.push_back(g.clone());
    return accumulated;
}

void Trainer::Impl::writeCheckpoint() {
    TrainerState saved{step, samplesSeen, sampler->epoch(), sampler->position(), target, microBatch,
                       optimizer->learningRate(), device.name(), model->name()};
    // A batch that ended an epoch leaves the position at its end: the next one starts a new epoch.
    if (sampler->position() >= data->size()) {
        saved.samplerEpoch = sampler->completedEpochs();
        saved.samplerPosition = 0;
    }
    auto written = saveCheckpoint(options.checkpoint.directory, *model, *optimizer, saved);
    if (written) {
        emit(CheckpointSaved{now(), step, *written});
    } else {
        checkpointError = written.error();
        emit(Warning{now(), "checkpoint not saved: " + written.error()});
    }
}

void Trainer::Impl::switchTo(const DeviceSpec& next) {
    const std::string from = device.name();
    if (next.kind == DeviceKind::Virtual && meter->allocated() > next.budgetBytes) {
        emit(Warning{now(), "cannot switch to " + next.name() + ": the model, its gradients and optimizer state already take " +
                                formatBytes(meter->allocated()) + "; choose a budget above that"});
        return;
    }
    const bool moves = (next.kind == DeviceKind::Cuda) != (device.kind == DeviceKind::Cuda) ||
                       (next.kind == DeviceKind::Cuda && next.index != device.index);
    if (moves) {
        const torch::Device target_device = torchDevice(next);
        model->to(target_device);
        parameters = model->parameters();
        optimizer->to(target_device, parameters);
        for (auto& g : gradients) g = g.to(target_device);
        if (reservation.defined()) reservation = reservation.to(target_device);
        meter->releaseCache();
    }
    device = next;
    meter = openMeter(device);
    emit(DeviceSwitched{now(), from, device.name()});
    reportSummary();
}

bool Trainer::Impl::waitWhilePaused() {
    std::unique_lock lock(mutex);
    if (pauseRequested && !stopRequested) {
        const RunState previous = state;
        lock.unlock();
        setState(RunState::Paused);
        lock.lock();
        wake.wait(lock, [&] { return !pauseRequested || stopRequested; });
        lock.unlock();
        if (!stopRequested) setState(previous);
        lock.lock();
    }
    return !stopRequested;
}

bool Trainer::Impl::applyCommands() {
    std::optional<std::pair<int64_t, LrScaling>> newTarget;
    std::optional<std::string> newDevice;
    std::optional<int64_t> equivalence;
    bool reprobe = false;
    {
        std::lock_guard lock(mutex);
        newTarget.swap(pendingTarget);
        newDevice.swap(pendingDevice);
        equivalence.swap(pendingEquivalence);
        std::swap(reprobe, pendingReprobe);
    }
    // Checked before the commands below change the micro-batch plan it compares against.
    if (equivalence) checkEquivalence(*equivalence);
    if (newDevice) {
        if (auto next = parseDevice(*newDevice)) {
            const std::string before = device.name();
            switchTo(*next);
            if (device.name() != before) {
                startProbe(ProbeReason::DeviceSwitch, microBatch > 0 ? microBatch : options.probe.initialMicroBatch, 0);
                reprobe = false;
            }
        } else {
            emit(Warning{now(), "device switch ignored: " + next.error()});
        }
    }
    if (newTarget && newTarget->first > data->size()) {
        emit(Warning{now(), "target batch " + std::to_string(newTarget->first) + " ignored: the data has " +
                                std::to_string(data->size()) + " samples, and a training batch uses each at most once; "
                                "training continues at " + std::to_string(target)});
        newTarget.reset();
    }
    if (newTarget && newTarget->first != target) {
        const double ratio = static_cast<double>(newTarget->first) / static_cast<double>(target);
        const double oldRate = optimizer->learningRate();
        double rate = oldRate;
        if (newTarget->second == LrScaling::Linear) rate *= ratio;
        if (newTarget->second == LrScaling::Sqrt) rate *= std::sqrt(ratio);
        optimizer->setLearningRate(rate);
        emit(TargetBatchChanged{now(), target, newTarget->first, oldRate, rate});
        target = newTarget->first;
        if (!probe) {
            startProbe(ProbeReason::TargetBatchChange, microBatch > 0 ? std::min(microBatch, target) : 1, 0);
            reprobe = false;
        }
    }
    if (reprobe && !probe) startProbe(ProbeReason::UserRequest, options.probe.initialMicroBatch, 0);
    std::lock_guard lock(mutex);
    return !stopRequested;
}

MicroResult Trainer::Impl::runMicroBatch(const std::vector<int64_t>& indices, double weight, std::vector<int64_t> next) {
    MicroResult result;
    const auto started = Clock::now();
    result.residentBytes = meter->allocated();
    meter->resetPeak();
    std::vector<torch::Tensor> savedBuffers;
    std::exception_ptr error;
    try {
        Batch host = prefetcher->take(indices);
        if (!next.empty()) prefetcher->request(std::move(next));  // loads while this one computes
        const torch::Device where = parameters.front().device();
        // The copy to the device is where its memory is first used: on the CPU and virtual
        // devices a counted clone stands for it.
        torch::Tensor inputs = where.is_cuda() ? host.inputs.to(where) : host.inputs.clone();
        torch::Tensor targets = where.is_cuda() ? host.targets.to(where) : host.targets.clone();
        host = Batch{};
        result.phase = Phase::Forward;
        for (const auto& b : model->buffers()) savedBuffers.push_back(b.clone());
        torch::Tensor output = model->forward(inputs);
        torch::Tensor loss = computeLoss(options.loss, output, targets);
        result.loss = loss.item<double>();
        if (!std::isfinite(result.loss)) throw NonFiniteLoss(nonFiniteLossReason(result.loss, inputs, output, targets));
        result.phase = Phase::Backward;
        // Gradients go to fresh tensors and join the batch's accumulators only once the whole
        // backward succeeded, so an OOM half-way never leaves part of a micro-batch behind.
        auto grads = torch::autograd::grad({loss * weight}, parameters, /*grad_outputs=*/{},
                                           /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
        {
            torch::NoGradGuard noGrad;
            CountingScope inPlace(false);
            for (size_t i = 0; i < grads.size(); ++i) {
                if (grads[i].defined()) gradients[i].add_(grads[i]);
            }
        }
        result.ok = true;
        result.peakBytes = meter->peakReserved();
    } catch (const std::exception&) {
        error = std::current_exception();
    }
    if (error) {
        // Outside the catch block, every tensor of the failed micro-batch is gone.
        result.failure = classifyFailure(error);
        result.peakBytes = meter->peakReserved();
        if (result.failure.outOfMemory) {
            releaseFailedBackward();
            torch::NoGradGuard noGrad;
            auto buffers = model->buffers();
            for (size_t i = 0; i < savedBuffers.size() && i < buffers.size(); ++i) buffers[i].copy_(savedBuffers[i]);
            meter->releaseCache();
            if (result.failure.requestedBytes == 0) result.failure.requestedBytes = meter->lastFailedAllocation();
        }
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    return result;
}

void Trainer::Impl::releaseFailedBackward() {
    // LibTorch 2.x leaves the node tasks of a backward pass that threw in the autograd engine's
    // ready queue, holding the failed micro-batch's saved activations and partial gradients
    // until a later backward pops them. A tiny backward here pops them now, so the retry starts
    // with the memory it had before the failed micro-batch.
    // On a GPU the tasks wait in that device's queue: the tiny backward runs there too.
    CountingScope uncounted(false);
    auto x = torch::zeros({1}, torch::TensorOptions().device(parameters.front().device()).requires_grad(true));
    (void)torch::autograd::grad({(x * 2).sum()}, {x});
}

void Trainer::Impl::optimizerStep() {
    constexpr int kAttempts = 3;
    if (reservation.defined()) reservation = torch::Tensor();
    const bool firstStep = !optimizer->stateReady();
    const int64_t beforeState = meter->allocated();
    for (int attempt = 1;; ++attempt) {
        std::exception_ptr error;
        try {
            optimizer->prepare();
        } catch (const std::exception&) {
            error = std::current_exception();
        }
        if (!error) break;
        const FailureInfo failure = classifyFailure(error);
        if (!failure.outOfMemory) throw FatalError{"optimizer step failed: " + failure.message, "step " + std::to_string(step + 1)};
        meter->releaseCache();
        const bool retry = attempt < kAttempts;
        emit(OomEvent{now(), step + 1, Phase::OptimizerStep, microBatch, failure.requestedBytes, failure.message, retry, microBatch});
        if (!retry) {
            throw FatalError{"the optimizer state does not fit on " + device.name() + " (" +
                                 formatBytes(optimizer->stateBytes()) + " needed); the accumulated gradients are kept "
                                 "but no step was taken: choose a larger device or SGD without momentum",
                             "step " + std::to_string(step + 1) + ", optimizer step"};
        }
    }
    optimizer->apply(gradients);
    optimizer->releaseScratch();
    // The state the optimizer created in its first step is what stays allocated after it.
    if (firstStep) optimizerStateBytes = std::max<int64_t>(0, meter->allocated() - beforeState);
    torch::NoGradGuard noGrad;
    CountingScope inPlace(false);
    for (auto& g : gradients) g.zero_();
}

void Trainer::Impl::trainBatch(const std::vector<int64_t>& indices) {
    const auto batchSize = static_cast<int64_t>(indices.size());
    const auto stepStart = Clock::now();
    int64_t offset = 0;
    int64_t committed = 0;
    int64_t largestUsed = 0;
    int64_t stepPeak = 0;
    PeakRecord trainingPeak;  // committed micro-batches of the plan
    PeakRecord trialPeak;     // probe trials that fit (used when the step had only those)
    double lossSum = 0;
    std::vector<int64_t> plan;  // remaining micro-batch sizes when not probing
    const auto stepLabel = [&] { return "step " + std::to_string(step + 1); };
    while (offset < batchSize) {
        if (!waitWhilePaused()) {
            // Stopped mid-batch: the partial gradients are dropped, the model keeps its last step.
            CountingScope inPlace(false);
            for (auto& g : gradients) g.zero_();
            return;
        }
        const int64_t remaining = batchSize - offset;
        int64_t size = 0;
        bool trial = false;
        if (probe) {
            const auto proposed = probe->next();
            if (!proposed) {
                finishProbe();
                plan.clear();
                continue;
            }
            // Below the model's smallest micro-batch: the probe has run out of sizes that fit.
            if (*proposed < minMicroBatch) doesNotFit(0);
            // A trial that would leave one sample for a model that cannot train on one waits for
            // the next batch.
            const bool leavesTooFew = remaining - *proposed > 0 && remaining - *proposed < minPart;
            if (*proposed <= remaining && !leavesTooFew) {
                size = *proposed;
                trial = true;
            } else if (probe->result() > 0) {
                size = planFor(remaining, probe->result()).front();
            } else {
                size = remaining;
                trial = true;
            }
        } else {
            if (plan.empty()) plan = planFor(remaining, microBatch);
            size = plan.front();
        }
        const std::vector<int64_t> slice(indices.begin() + offset, indices.begin() + offset + size);
        if (!waitForAdvance(StepModeWaiting{now(), step + 1, committed, offset, size, batchSize, trial})) {
            // Stopped while waiting in step-by-step mode: as for a stop mid-batch.
            CountingScope inPlace(false);
            for (auto& g : gradients) g.zero_();
            return;
        }
        std::vector<int64_t> next;
        if (options.prefetch && !trial && plan.size() >= 2) {
            // The next micro-batch is known: load it while this one computes.
            const int64_t nextOffset = offset + size;
            next.assign(indices.begin() + nextOffset, indices.begin() + nextOffset + plan[1]);
        }
        const double weight = static_cast<double>(size) / static_cast<double>(batchSize);
        MicroResult r = runMicroBatch(slice, weight, std::move(next));
        stepPeak = std::max(stepPeak, r.peakBytes);
        if (!r.ok && r.failure.outOfMemory && size == 1 && singleSampleOoms < kSingleSampleRetries) {
            // Memory can be taken by others for a moment; retry a single sample before declaring
            // that the model does not fit at all.
            ++singleSampleOoms;
            emit(OomEvent{now(), step + 1, r.phase, size, r.failure.requestedBytes, r.failure.message, true, 1});
            continue;
        }
        if (r.ok) singleSampleOoms = 0;
        if (trial) {
            const bool fit = r.ok;
            if (fit || r.failure.outOfMemory) {
                probe->record({size, fit, r.peakBytes});
                emit(ProbeTrial{now(), probeSequence, probe->trials(), size, fit, fit && r.peakBytes <= probe->usableBytes(),
                                r.peakBytes, fit ? 0 : r.failure.requestedBytes, r.seconds});
            }
        }
        if (!r.ok && !r.failure.outOfMemory) {
            std::string message = r.failure.message;
            if (size < 2 && needsTwoSamples(message)) {
                if (minMicroBatch < 2 && upperBound() >= 2) {
                    // Nothing of the failed sample was kept (the error came before any gradient).
                    minMicroBatch = 2;
                    minPart = std::max<int64_t>(minPart, 2);
                    emit(Warning{now(), "the model's BatchNorm cannot train on a single sample (its last feature map is "
                                        "1x1, one value per channel): micro-batches hold at least 2 samples from now on"});
                    if (trial) {
                        startProbe(currentProbeReason, 2, 0);
                    } else {
                        microBatch = std::max<int64_t>(microBatch, 2);
                        plan.clear();
                    }
                    continue;
                }
                if (upperBound() < 2) {
                    message += " (the model's BatchNorm cannot train on one sample, and micro-batches are limited to 1 "
                               "here: allow at least 2 with --max-micro-batch and --target-batch)";
                }
            }
            throw FatalError{message, stepLabel() + ", micro-batch " + std::to_string(committed + 1) + " (" +
                                          std::to_string(size) + " samples), " + toString(r.phase)};
        }
        if (!r.ok) {
            int64_t next = 0;
            if (trial) {
                next = probe->result();
            } else {
                if (size <= 1 || (size / 2 < minMicroBatch && microBatch <= minMicroBatch)) {
                    doesNotFit(r.failure.requestedBytes);
                }
                next = std::max<int64_t>(minMicroBatch, size / 2);
                microBatch = next;
                cleanStepsSinceShrink = 0;
                plan.clear();
            }
            emit(OomEvent{now(), step + 1, r.phase, size, r.failure.requestedBytes, r.failure.message, true, next});
            sampleMemory(true);
            continue;
        }
        if (!trial && !plan.empty()) plan.erase(plan.begin());
        (trial ? trialPeak : trainingPeak).offer(r.residentBytes, r.peakBytes, size);
        const bool teaching = stepModeOn();
        MicroBatchDone done{now(), step + 1, committed, offset, size, batchSize, weight, r.loss, trial, {}};
        if (options.reportSampleIndices || teaching) done.sampleIndices = slice;
        if (options.reportGradientNorm || teaching) done.gradientNorm = gradientNorm();
        emit(std::move(done));
        lossSum += r.loss * weight;
        largestUsed = std::max(largestUsed, size);
        offset += size;
        ++committed;
        sampleMemory(false);
    }
    if (probe && !probe->next()) finishProbe();
    lastPeak = trainingPeak.size > 0 ? trainingPeak : trialPeak;
    optimizerStep();
    ++step;
    samplesSeen += batchSize;
    const double seconds = std::chrono::duration<double>(Clock::now() - stepStart).count();
    emit(OptimizerStepped{now(), step, committed});
    emit(StepMetrics{now(), step, sampler->epoch(), samplesSeen, lossSum, largestUsed,
                     microBatch > 0 ? static_cast<int64_t>(planFor(target, microBatch).size()) : committed, target,
                     optimizer->learningRate(), seconds > 0 ? static_cast<double>(batchSize) / seconds : 0.0, seconds,
                     stepPeak, totalSteps()});
    sampleMemory(true);
    reportBreakdown();
    if (const int64_t retries = meter->allocatorRetries(); retries > allocatorRetriesSeen) {
        emit(Warning{now(), "the CUDA caching allocator had to free its cache and retry " +
                                std::to_string(retries - allocatorRetriesSeen) + " allocation(s) during step " +
                                std::to_string(step) + ": device memory is fragmented; a larger --headroom leaves "
                                "it room (each retry costs time)"});
        allocatorRetriesSeen = retries;
    }
    lastBatch = indices;
    {
        std::lock_guard lock(mutex);
        finishingBatch = false;
    }
    if (options.checkpoint.everySteps > 0 && step % options.checkpoint.everySteps == 0) writeCheckpoint();
    if (cleanStepsSinceShrink >= 0 && !probe && ++cleanStepsSinceShrink >= options.regrowAfterSteps &&
        options.regrowAfterSteps > 0) {
        cleanStepsSinceShrink = -1;
        if (microBatch < probedMicroBatch) startProbe(ProbeReason::Regrow, microBatch, microBatch);
    }
}

Trainer::Trainer(TrainerOptions options, EventSink& sink) : m_impl(std::make_unique<Impl>(std::move(options), sink)) {
    installCountingAllocator();
}

Trainer::~Trainer() = default;

RunResult Trainer::run() {
    Impl& d = *m_impl;
    CountingScope counting(true);
    d.start = Clock::now();
    RunResult result;
    d.setState(RunState::Starting, d.options.device);
    try {
        d.setup();
        d.reportSummary();
        d.sampleMemory(true);
        d.reportBreakdown();
        if (d.microBatch == 0) {
            d.startProbe(ProbeReason::Initial, d.options.probe.initialMicroBatch, 0);
        } else {
            d.setState(RunState::Training, "micro-batch " + std::to_string(d.microBatch));
        }
        while (!d.limitReached()) {
            if (!d.applyCommands() || !d.waitWhilePaused()) break;
            d.trainBatch(d.sampler->next(d.target));
            std::lock_guard lock(d.mutex);
            if (d.stopRequested) break;
        }
        std::optional<int64_t> equivalence;
        {
            std::lock_guard lock(d.mutex);
            result.stopped = d.stopRequested;
            equivalence.swap(d.pendingEquivalence);
        }
        // A check asked for during the last batch still runs: the user is waiting for it.
        if (equivalence && !result.stopped) d.checkEquivalence(*equivalence);
        if (result.stopped) d.setState(RunState::Stopping);
        d.reservation = torch::Tensor();
        const bool savedThisStep = d.options.checkpoint.everySteps > 0 && d.step % d.options.checkpoint.everySteps == 0;
        if (!d.options.checkpoint.directory.empty() && d.step > 0 && !savedThisStep) d.writeCheckpoint();
        result.state = RunState::Finished;
        d.setState(RunState::Finished, result.stopped ? "stopped" : "done");
    } catch (const LoadingCancelled&) {
        // Stopped while loading: nothing was trained, nothing to save.
        result.state = RunState::Finished;
        result.stopped = true;
        d.setState(RunState::Finished, "stopped while loading the data");
    } catch (const FatalError& e) {
        result.state = RunState::Failed;
        result.error = e.message;
        result.badInput = e.where == "configuration" || e.where == "dataset" || e.where == "model" ||
                          e.where == "resume" || e.where == "checkpoint";
        d.emit(ErrorEvent{d.now(), e.message, e.where});
        d.setState(RunState::Failed, e.message);
    } catch (const std::exception& e) {
        const FailureInfo failure = classifyFailure(std::current_exception());
        result.state = RunState::Failed;
        result.error = failure.message;
        d.emit(ErrorEvent{d.now(), failure.message, "step " + std::to_string(d.step + 1)});
        d.setState(RunState::Failed, failure.message);
    }
    result.steps = d.step;
    result.checkpointError = d.checkpointError;
    // A run that ended while probing reports the largest size that fit so far.
    result.microBatch = d.microBatch > 0 || !d.probe ? d.microBatch : d.probe->result();
    d.probe.reset();
    d.reservation = torch::Tensor();
    return result;
}

void Trainer::pause() {
    std::lock_guard lock(m_impl->mutex);
    m_impl->pauseRequested = true;
}

void Trainer::resume() {
    {
        std::lock_guard lock(m_impl->mutex);
        m_impl->pauseRequested = false;
    }
    m_impl->wake.notify_all();
}

void Trainer::stop() {
    {
        std::lock_guard lock(m_impl->mutex);
        m_impl->stopRequested = true;
    }
    m_impl->cancelLoading.store(true);
    m_impl->wake.notify_all();
}

void Trainer::setTargetBatch(int64_t target, std::optional<LrScaling> rule) {
    if (target <= 0) return;
    std::lock_guard lock(m_impl->mutex);
    m_impl->pendingTarget = std::make_pair(target, rule.value_or(m_impl->options.lrScaling));
}

void Trainer::reprobe() {
    std::lock_guard lock(m_impl->mutex);
    m_impl->pendingReprobe = true;
}

void Trainer::switchDevice(const std::string& device) {
    std::lock_guard lock(m_impl->mutex);
    m_impl->pendingDevice = device;
}

void Trainer::setStepMode(bool on) {
    {
        std::lock_guard lock(m_impl->mutex);
        m_impl->stepMode = on;
        m_impl->advanceTokens = 0;
    }
    m_impl->wake.notify_all();
}

void Trainer::advance() {
    {
        std::lock_guard lock(m_impl->mutex);
        if (!m_impl->stepMode) return;
        ++m_impl->advanceTokens;
    }
    m_impl->wake.notify_all();
}

void Trainer::finishBatch() {
    {
        std::lock_guard lock(m_impl->mutex);
        if (!m_impl->stepMode) return;
        m_impl->finishingBatch = true;
        m_impl->advanceTokens = 0;
    }
    m_impl->wake.notify_all();
}

void Trainer::checkEquivalence(int64_t samples) {
    std::lock_guard lock(m_impl->mutex);
    m_impl->pendingEquivalence = std::max<int64_t>(0, samples);
}

std::shared_ptr<Model> Trainer::model() const { return m_impl->model; }

}  // namespace batchpilot::core
