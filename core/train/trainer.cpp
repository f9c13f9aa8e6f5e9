// The trainer: setup, the loop over training batches, micro-batches with OOM recovery, the
// optimizer step, and the commands it applies between them. Its other parts: see trainer_impl.h.
// About 500 lines on purpose: the loop and its OOM recovery read top-down in one file; what can
// be understood on its own (probe, memory, equivalence, checkpoints, commands) lives elsewhere.

#include "core/train/trainer_impl.h"

#include "core/base/hold_point.h"
#include "core/train/failure_explanation.h"

namespace batchpilot::core {

void Trainer::Impl::setup() {
    auto checked = validate(options);
    if (!checked) throw badInput(checked.error(), "configuration");
    auto parsed = parseDevice(options.device);
    if (!parsed) throw badInput(parsed.error(), "configuration");
    hardware.device = *parsed;
    torch::set_num_threads(intraOpThreadsFor(options.intraOpThreads, options.reservedCpus));
    if (checkpointer.enabled()) {
        // Found out now, not after hours of training (nor after loading the data): a checkpoint
        // folder that cannot be written, or that another run is saving into. Held to the run's
        // end.
        auto taken = checkpointer.takeFolder();
        if (!taken) throw badInput(taken.error(), "checkpoint");
        if (!taken->empty()) emit(Warning{now(), *taken});
    }
    loadData();
    checkDataAndCheckpoints();
    for (const std::string& warning : feed.training->warnings()) emit(Warning{now(), warning});
    if (feed.validation.data && !options.validation.path.empty()) {
        for (const std::string& warning : feed.validation.data->warnings())
            emit(Warning{now(), "validation data: " + warning});
    }
    feed.prefetcher = std::make_unique<Prefetcher>(feed.training);
    feed.cpus = cpusAvailable();
    if (hardware.device.kind == DeviceKind::Cuda && options.cudaMemoryFraction > 0) {
        setCudaMemoryFraction(hardware.device.index, options.cudaMemoryFraction);
    }
    hardware.meter = openMeter(hardware.device);
    meterOpened();
    if (const std::string note = hardware.meter->limitNote(); !note.empty())
        emit(Warning{now(), hardware.device.name() + ": " + note});
    hardware.meter->resetPeak();
    progress.target = options.targetBatch;
    feed.sampler.emplace(feed.training->size(), options.seed);
    buildModel();
    learner.lossScaler = LossScaler(options.lossScale);  // or the checkpoint's, when it recorded one
    if (!options.resumeFrom.empty()) restoreCheckpoint();
    checkSaversSuitModel();
    useMemorySavers(options.memorySavers == MemorySavers::Auto ? MemorySavers::Off : options.memorySavers);
    if (learner.model->usesBatchStatistics()) {
        choice.keepPartsOfTwo();
        emit(Warning{now(),
                     "the model uses BatchNorm: each micro-batch is normalised with its own "
                     "statistics, so accumulated gradients differ from full-batch ones; for exact "
                     "accumulation use GroupNorm or LayerNorm (the built-in resnet: --norm group)"});
    }
    if (options.parallel) setupParallel();
}

void Trainer::Impl::loadData() {
    // The dataset lives in host memory: it does not count against the device.
    CountingScope host(false);
    CancelScope cancellable(commands.cancelFlag());
    auto made = options.datasetFactory ? options.datasetFactory() : makeDataset(options.data);
    if (!made && commands.cancelFlag().load()) throw LoadingCancelled{};
    if (!made) throw badInput(made.error(), "dataset");
    auto split = makeValidation(options, *made);
    if (!split && commands.cancelFlag().load()) throw LoadingCancelled{};
    if (!split) throw badInput(split.error(), "dataset");
    feed.validation.outOfTraining = split->training != *made;
    feed.training = split->training;
    feed.validation.data = split->validation;
}

void Trainer::Impl::checkDataAndCheckpoints() const {
    if (feed.training->size() <= 0) throw badInput("the dataset \"" + feed.training->name() + "\" is empty", "dataset");
    if (options.loss == LossKind::CrossEntropy && !options.data.regression && feed.training->classes() < 2) {
        throw badInput(
            "the data " + feed.training->name() +
                " has a single class: a classifier learns nothing from it (its loss "
                "is 0 from the start); give data with at least two classes, or train a regression (--loss mse)",
            "dataset");
    }
    // Resumed runs check the checkpoint's target below.
    if (options.resumeFrom.empty() && options.targetBatch > feed.training->size()) {
        throw badInput(
            "the target batch " + std::to_string(options.targetBatch) +
                " is larger than the data: " + feed.training->name() + " has " + std::to_string(feed.training->size()) +
                " samples, and a training batch uses each sample at most once; choose a target batch of at most " +
                std::to_string(feed.training->size()),
            "configuration");
    }
    if (options.checkpoint.directory.empty() &&
        (options.checkpoint.everySteps > 0 || !options.checkpoint.keepBest.empty())) {
        throw badInput(std::string("checkpoints were asked for (") +
                           (options.checkpoint.everySteps > 0 ? "an interval" : "keeping the best model") +
                           ") but there is no folder to keep them in: name a checkpoint directory "
                           "(--checkpoint-dir DIR), or record the run in a run folder, which keeps them",
                       "configuration");
    }
    if (!options.checkpoint.keepBest.empty()) {
        const std::string& metric = options.checkpoint.keepBest;
        if (!feed.validation.data) {
            throw badInput("keeping the best model by " + metric +
                               " needs validation data: hold out a share of the data (--validation-split) or give "
                               "--validation-data",
                           "configuration");
        }
        if (metric == "val_top5_accuracy" && feed.training->classes() <= 5) {
            throw badInput("keeping the best model by val_top5_accuracy needs more than 5 classes, but the data has " +
                               std::to_string(feed.training->classes()) + ": keep it by val_accuracy",
                           "configuration");
        }
    }
}

void Trainer::Impl::buildModel() {
    try {
        torch::manual_seed(options.seed);
        // Parameters and gradient accumulators are measured as what they add on the device.
        const int64_t beforeModel = hardware.meter->allocated();
        auto made =
            options.modelFactory ? options.modelFactory(*feed.training) : makeModel(options.model, *feed.training);
        if (!made) throw badInput(made.error(), "model");
        learner.model = *made;
        learner.model->to(torchDevice(hardware.device));
        learner.model->train(true);
        learner.parameters = learner.model->parameters();
        if (learner.parameters.empty()) throw badInput("the model has no trainable parameters", "model");
        hardware.ledger.parameterBytes = hardware.meter->allocated() - beforeModel;
        learner.gradients.clear();
        for (const auto& p : learner.parameters) learner.gradients.push_back(torch::zeros_like(p));
        linkGradients();
        hardware.ledger.gradientBytes = hardware.meter->allocated() - beforeModel - hardware.ledger.parameterBytes;
        learner.optimizer = std::make_unique<Optimizer>(options.optimizer, learner.parameters);
    } catch (const FatalError&) {
        throw;
    } catch (const std::exception&) {
        const FailureInfo failure = classifyFailure(std::current_exception());
        if (failure.outOfMemory) doesNotFit(failure.requestedBytes, /*duringSetup=*/true);
        throw badInput("could not build the model: " + failure.message, "model");
    }
}

void Trainer::Impl::checkSaversSuitModel() const {
    if (checkpoints(options.memorySavers)) {
        if (const std::string why = learner.model->checkpointingUnsupported(); !why.empty()) {
            throw badInput(std::string("activation checkpointing (memory savers ") + toString(options.memorySavers) +
                               ") needs a model whose parts can be recomputed in backward, but " +
                               learner.model->name() + ": " + why +
                               "; use the memory savers bf16, or auto (which goes without checkpointing)",
                           "model");
        }
    }
    if (autocastsFp16(options.memorySavers)) {
        if (const std::string why = float16Unavailable(); !why.empty()) {
            throw badInput(
                std::string("float16 autocast (memory savers ") + toString(options.memorySavers) + ") " + why, "model");
        }
    }
}

std::string Trainer::Impl::float16Unavailable() const {
    if (hardware.device.kind == DeviceKind::Cuda || BATCHPILOT_CPU_AUTOCASTS_FLOAT16) return {};
    return "needs a CUDA device, or LibTorch 2.5 or later on the CPU, and " + hardware.device.name() +
           " runs on the CPU with LibTorch " + TORCH_VERSION +
           ": use bf16 there (the same memory, float32's range, no loss scaling needed)";
}

bool Trainer::Impl::unscaleGradients() {
    torch::NoGradGuard noGrad;
    CountingScope inPlace(false);
    // One flag on the device, read once: a sum of the gradients could overflow where none does.
    torch::Tensor overflow;
    for (const torch::Tensor& g : learner.gradients) {
        const torch::Tensor bad = g.isfinite().logical_not().any();
        overflow = overflow.defined() ? overflow.logical_or(bad) : bad;
    }
    if (overflow.defined() && overflow.item<bool>()) return false;
    for (torch::Tensor& g : learner.gradients) g.div_(learner.lossScaler.scale());
    return true;
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
        if (autocastsFp16(learner.savers)) {
            return became +
                   ": the model's output overflowed float16, whose largest value is 65504, under float16 "
                   "autocast (memory savers " +
                   toString(learner.savers) +
                   "); loss scaling cannot help a forward pass: train with bf16 (the same memory, float32's "
                   "range) or without the float16 savers";
        }
        if (progress.step == 0) {
            return became +
                   ": the model's output is NaN or infinite on finite inputs before any weight was updated, "
                   "so the model itself produces it; check its weights and its forward";
        }
        return became + " at step " + std::to_string(progress.step + 1) + ": the model's outputs overflowed after " +
               std::to_string(progress.step) +
               " optimizer step(s), which is how training diverges; lower the learning rate "
               "(it is " +
               formatText("%g", learner.optimizer->learningRate()) + ")";
    }
    return became +
           " on finite outputs (outputs or targets too large for the loss?); lower the learning rate or "
           "rescale the data";
}

bool Trainer::Impl::waitWhilePaused() {
    const RunState previous = progress.state;
    return commands.waitWhilePaused([&] { setState(RunState::Paused); }, [&] { setState(previous); });
}

bool Trainer::Impl::applyCommands() {
    CommandMailbox::Batch asked = commands.take();
    const std::optional<std::string> newDevice = routeCommands(asked);
    // Checked before the commands below change the micro-batch plan it compares against.
    if (asked.equivalence) checkEquivalence(*asked.equivalence);
    bool probing = newDevice && switchDeviceAsked(*newDevice);
    probing = applyTargetAsked(asked.target) || probing;
    probing = applySaversAsked(asked.savers, asked.surveySavers) || probing;
    if (asked.reprobe && !probing && !choice.probing())
        startProbe(ProbeReason::UserRequest, options.probe.initialMicroBatch, 0);
    return !commands.stopRequested();
}

std::optional<std::string> Trainer::Impl::routeCommands(CommandMailbox::Batch& asked) {
    std::optional<std::string> newDevice;
    const int world = parallel ? parallel->link->size() : 1;
    for (auto& [rank, spec] : asked.devices) {
        if (rank < 0 || rank >= world) {
            emit(Warning{now(), "device switch of rank " + std::to_string(rank) + " to " + spec + " ignored: " +
                                    (parallel ? "the job has ranks 0 to " + std::to_string(world - 1)
                                              : std::string("this run trains on one device (rank 0)"))});
        } else if (parallel) {
            // Several devices: every rank switches at the same batch, agreed in ranksAgree.
            parallel->requestedDevices[rank] = std::move(spec);
        } else {
            newDevice = std::move(spec);
        }
    }
    if (!parallel) return newDevice;
    // Several devices: every rank checks, changes its savers or measures them at the same batch,
    // agreed in ranksAgree.
    if (asked.equivalence) parallel->requestedEquivalence = asked.equivalence;
    if (asked.savers && *asked.savers != MemorySavers::Auto) parallel->requestedSavers = *asked.savers;
    if (asked.surveySavers) parallel->surveyRequested = true;
    asked.equivalence.reset();
    asked.savers.reset();
    asked.surveySavers = false;
    return newDevice;
}

bool Trainer::Impl::switchDeviceAsked(const std::string& spec) {
    const auto next = parseDevice(spec);
    if (!next) {
        emit(Warning{now(), "device switch ignored: " + next.error()});
        return false;
    }
    const std::string before = hardware.device.name();
    if (std::optional<std::string> refused = switchTo(*next)) emit(Warning{now(), *refused});
    return hardware.device.name() != before;  // switchTo started a probe there
}

bool Trainer::Impl::applyTargetAsked(const std::optional<std::pair<int64_t, LrScaling>>& asked) {
    if (!asked || asked->first == progress.target) return false;
    if (asked->first > feed.training->size()) {
        emit(Warning{now(), "target batch " + std::to_string(asked->first) + " ignored: the data has " +
                                std::to_string(feed.training->size()) +
                                " samples, and a training batch uses each at most once; "
                                "training continues at " +
                                std::to_string(progress.target)});
        return false;
    }
    // Several devices: every rank changes at the same batch, agreed in ranksAgree.
    if (parallel) {
        parallel->requestedTarget = asked;
        return false;
    }
    return changeTarget(asked->first, asked->second);
}

bool Trainer::Impl::applySaversAsked(std::optional<MemorySavers> asked, bool survey) {
    if (asked && *asked != learner.savers) return applySavers(*asked, "asked for");
    if (!survey && learner.saverChoices.surveyDue.empty()) return false;
    // A survey asked for, or due after a probe that found a small micro-batch (finishProbe).
    const SaverSurvey found = surveySavers(survey ? "asked for" : learner.saverChoices.surveyDue);
    learner.saverChoices.surveyDue.clear();
    if (found.suggestion.empty() || survey) return false;
    const MemorySavers next = *parseMemorySavers(found.suggestion);
    if (options.memorySavers == MemorySavers::Auto) return applySavers(next, "memory savers auto: " + found.advice);
    emit(Warning{now(), "memory savers: " + found.advice + "; train with --memory-savers " + found.suggestion +
                            " (or auto), or apply it in the app's Memory savers panel"});
    return false;
}

bool Trainer::Impl::changeTarget(int64_t next, LrScaling rule) {
    const double ratio = static_cast<double>(next) / static_cast<double>(progress.target);
    const double oldRate = learner.optimizer->learningRate();
    double rate = oldRate;
    if (rule == LrScaling::Linear) rate *= ratio;
    if (rule == LrScaling::Sqrt) rate *= std::sqrt(ratio);
    learner.optimizer->setLearningRate(rate);
    emit(TargetBatchChanged{now(), progress.target, next, oldRate, rate});
    progress.target = next;
    if (choice.probing()) return false;
    startProbe(ProbeReason::TargetBatchChange,
               choice.sizes().microBatch > 0 ? std::min(choice.sizes().microBatch, localTarget()) : 1, 0);
    return true;
}

void Trainer::Impl::linkGradients() {
    for (size_t i = 0; i < learner.parameters.size(); ++i) {
        const torch::Tensor accumulator = i < learner.gradients.size() ? learner.gradients[i] : torch::Tensor();
        if (!learner.parameters[i].grad().is_same(accumulator)) learner.parameters[i].mutable_grad() = accumulator;
    }
}

void Trainer::Impl::restoreBuffers(const std::vector<torch::Tensor>& saved) {
    torch::NoGradGuard noGrad;
    CountingScope inPlace(false);
    auto buffers = learner.model->buffers();
    for (size_t i = 0; i < saved.size() && i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
}

std::vector<torch::Tensor> Trainer::Impl::copyBuffers() const {
    // Counted: on a GPU these copies take device memory, and the breakdown names them.
    torch::NoGradGuard noGrad;
    std::vector<torch::Tensor> copies;
    for (const auto& b : learner.model->buffers()) copies.push_back(b.clone());
    return copies;
}

MicroResult Trainer::Impl::runMicroBatch(const std::vector<int64_t>& indices, double weight, std::vector<int64_t> next,
                                         bool measurement, std::vector<torch::Tensor>* buffersBefore) {
    MicroResult result;
    const auto started = timingNow();
    result.residentBytes = hardware.meter->allocated();
    hardware.meter->resetPeak();
    // The model's buffers (BatchNorm's statistics) before this micro-batch: a failed one must not
    // have moved them.
    std::vector<torch::Tensor> savedBuffers;
    std::exception_ptr error;
    try {
        forwardBackward(indices, weight, std::move(next), result, savedBuffers);
    } catch (const std::exception&) {
        error = std::current_exception();
    }
    result.peakBytes = hardware.meter->peakReserved();
    result.peakAllocatedBytes = hardware.meter->peak();
    if (error) {
        // Here every tensor of the failed micro-batch is gone (they were forwardBackward's).
        afterMicroBatchError(error, static_cast<int64_t>(indices.size()), result, savedBuffers);
    } else if (measurement) {
        restoreBuffers(savedBuffers);  // the model's statistics are as before it
    } else if (buffersBefore != nullptr) {
        *buffersBefore = std::move(savedBuffers);
    }
    result.seconds = std::chrono::duration<double>(timingNow() - started).count();
    return result;
}

void Trainer::Impl::forwardBackward(const std::vector<int64_t>& indices, double weight, std::vector<int64_t> next,
                                    MicroResult& result, std::vector<torch::Tensor>& savedBuffers) {
    Batch host = feed.prefetcher->take(indices);
    if (!next.empty()) feed.prefetcher->request(std::move(next));  // loads while this one computes
    const torch::Device where = learner.parameters.front().device();
    // The copy to the device is where its memory is first used: on the CPU and virtual
    // devices a counted clone stands for it.
    torch::Tensor inputs = where.is_cuda() ? host.inputs.to(where) : host.inputs.clone();
    torch::Tensor targets = where.is_cuda() ? host.targets.to(where) : host.targets.clone();
    host = Batch{};
    result.inputBytes = static_cast<int64_t>(inputs.nbytes() + targets.nbytes());
    result.phase = Phase::Forward;
    savedBuffers = copyBuffers();
    for (const auto& b : savedBuffers) result.bufferCopyBytes += static_cast<int64_t>(b.nbytes());
    torch::Tensor output;
    {
        AutocastScope autocast(where.type(), forwardAutocast());  // bfloat16 with that memory saver
        output = learner.model->forward(inputs);
    }
    torch::Tensor loss = computeLoss(options.loss, output, targets);  // in float32 also under bf16
    result.loss = loss.item<double>();
    if (!std::isfinite(result.loss)) throw NonFiniteLoss(nonFiniteLossReason(result.loss, inputs, output, targets));
    // Autograd keeps what backward needs; the output itself (logits: samples × classes) need
    // not stay through backward, as in a loop that passes it straight to the loss.
    output = torch::Tensor();
    result.phase = Phase::Backward;
    // Backward adds the weighted gradient straight into the batch's accumulators, which are
    // the parameters' .grad: each parameter's new gradient is freed as soon as it is added,
    // so the device holds one set of gradients, as a plain training loop does. An OOM half-way
    // leaves part of this micro-batch there: trainBatch then trains the batch again from its
    // first sample (OomEvent::redoneSamples).
    // float16 autocast: scaled up so that small gradients do not round to zero in float16
    // (divided again before the step, unscaleGradients).
    linkGradients();
    torch::autograd::backward({loss * (weight * backwardScale())}, /*grad_tensors=*/{}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*inputs=*/learner.parameters);
    result.ok = true;
}

void Trainer::Impl::afterMicroBatchError(const std::exception_ptr& error, int64_t size, MicroResult& result,
                                         const std::vector<torch::Tensor>& savedBuffers) {
    result.failure = classifyFailure(error);
    // oneDNN's "could not create a primitive" and the like: memory, where a smaller
    // micro-batch of the same shapes is left to try; the error it says at the smallest.
    if (!result.failure.outOfMemory && result.failure.maybeOutOfMemory &&
        size > std::max(choice.sizes().minMicroBatch, choice.sizes().minPart)) {
        result.failure.outOfMemory = true;
        result.failure.message +=
            " (taken for an out-of-memory error: this library also says it when memory "
            "runs out; a smaller micro-batch is tried)";
    }
    if (!result.failure.outOfMemory) return;
    releaseFailedBackward();
    restoreBuffers(savedBuffers);
    hardware.meter->releaseCache();
    if (result.failure.requestedBytes == 0) result.failure.requestedBytes = hardware.meter->lastFailedAllocation();
}

void Trainer::Impl::releaseFailedBackward() {
    // LibTorch 2.x leaves the node tasks of a backward pass that threw in the autograd engine's
    // ready queue, holding the failed micro-batch's saved activations and partial gradients
    // until a later backward pops them. A tiny backward here pops them now, so the retry starts
    // with the memory it had before the failed micro-batch.
    // On a GPU the tasks wait in that device's queue: the tiny backward runs there too.
    CountingScope uncounted(false);
    auto x = torch::zeros({1}, torch::TensorOptions().device(learner.parameters.front().device()).requires_grad(true));
    (void)torch::autograd::grad({(x * 2).sum()}, {x});
}

void Trainer::Impl::optimizerStep() {
    constexpr int kAttempts = 3;
    learner.reservation.clear();
    const bool firstStep = !learner.optimizer->stateReady();
    const int64_t beforeState = hardware.meter->allocated();
    for (int attempt = 1;; ++attempt) {
        std::exception_ptr error;
        try {
            learner.optimizer->prepare();
        } catch (const std::exception&) {
            error = std::current_exception();
        }
        if (!error) break;
        const FailureInfo failure = classifyFailure(error);
        if (!failure.outOfMemory)
            throw FatalError{"optimizer step failed: " + failure.message, "step " + std::to_string(progress.step + 1)};
        hardware.meter->releaseCache();
        const bool retry = attempt < kAttempts;
        emit(OomEvent{now(), progress.step + 1, Phase::OptimizerStep, choice.sizes().microBatch, failure.requestedBytes,
                      failure.message, retry, choice.sizes().microBatch, /*redoneSamples=*/0, /*snapshotFile=*/{}});
        if (!retry) {
            throw FatalError{"the optimizer state does not fit on " + hardware.device.name() + " (" +
                                 formatBytes(learner.optimizer->stateBytes()) +
                                 " needed); the accumulated gradients are kept "
                                 "but no step was taken: choose a larger device or SGD without momentum",
                             "step " + std::to_string(progress.step + 1) + ", optimizer step"};
        }
    }
    learner.optimizer->apply(learner.gradients);
    learner.optimizer->releaseScratch();
    // The state the optimizer created in its first step is what stays allocated after it.
    if (firstStep)
        hardware.ledger.optimizerStateBytes = std::max<int64_t>(0, hardware.meter->allocated() - beforeState);
    torch::NoGradGuard noGrad;
    CountingScope inPlace(false);
    for (auto& g : learner.gradients) g.zero_();
}

void Trainer::Impl::trainBatch(const std::vector<int64_t>& indices, int64_t batchSize) {
    // With several devices this rank trains its share; the weights stay those of the whole batch.
    const auto localSize = static_cast<int64_t>(indices.size());
    const auto stepStart = timingNow();  // a batch trained again counts from its first try
    for (bool again = false;; again = true) {
        BatchPass pass;
        pass.clean = !again;
        if (choice.checking()) pass.checkSize = choice.plannedMicroBatch();
        if (parallel) parallel->oomsInStep = 0;
        if (!accumulate(pass, indices, batchSize)) return dropPartialBatch(pass);
        if (choice.probing() && !choice.probe().next()) finishProbe();
        hardware.ledger.lastPeak = pass.trainingPeak.size > 0 ? pass.trainingPeak : pass.trialPeak;
        const double computeSeconds = std::chrono::duration<double>(timingNow() - stepStart).count();
        const int64_t plannedLocal = localTarget();  // before reduceOverRanks chooses the next shares
        if (parallel) {
            // A probe's trials (and its OOMs) say nothing of the speed to come; the fastest-micro-batch
            // timing trains at sizes that all fit, close enough to balance by, and can take many
            // steps on a small share.
            pass.lossSum = reduceOverRanks(pass.lossSum, localSize, pass.largestUsed, pass.committed, pass.stepPeak,
                                           computeSeconds, !choice.probing());
        }
        if (autocastsFp16(learner.savers) && !unscaleGradients()) {
            // A gradient overflowed float16 at this scale (on some rank: the sums above carry it to
            // every rank, which all decide alike). No step: the batch is trained again at half the
            // scale, so no sample is skipped.
            halveLossScale(localSize);
            dropPartialBatch(pass);
            continue;
        }
        finishStep(pass, indices, batchSize, stepStart, computeSeconds, plannedLocal);
        return;
    }
}

bool Trainer::Impl::accumulate(BatchPass& pass, const std::vector<int64_t>& indices, int64_t batchSize) {
    const auto localSize = static_cast<int64_t>(indices.size());
    while (pass.offset < localSize) {
        // Several devices: the other ranks wait for this one's gradients, so a stop or pause waits
        // for the batch's end, where the ranks agree on it (ranksAgree).
        const auto pauseStart = timingNow();
        if (!parallel && !waitWhilePaused()) return false;
        pass.waitSeconds += std::chrono::duration<double>(timingNow() - pauseStart).count();
        const std::optional<SizeChoice::Next> picked = chooseMicroBatch(pass, localSize - pass.offset);
        if (!picked) continue;  // the probe ended or the savers changed: choose again
        const int64_t size = picked->size;
        const bool trial = picked->trial;
        const std::vector<int64_t> slice(indices.begin() + pass.offset, indices.begin() + pass.offset + size);
        const StepModeWaiting waiting{now(), progress.step + 1, pass.committed, pass.offset, size, batchSize, trial};
        const auto advanceStart = timingNow();
        if (!parallel && !commands.waitForAdvance([&] { emit(waiting); })) return false;
        pass.waitSeconds += std::chrono::duration<double>(timingNow() - advanceStart).count();
        const double weight = static_cast<double>(size) / static_cast<double>(batchSize);
        // A trial measures what its own size reserves, not the cache earlier trials left: with a
        // caching allocator (a GPU, a virtual one with its model) the probe's line would
        // otherwise fit the cache.
        // Not before a trial's second micro-batch: that one measures the cache the first left.
        const bool repeat = trial && choice.isRepeat(size);
        if (trial && !repeat) hardware.meter->releaseCache();
        MicroResult r = runMicroBatch(slice, weight, nextToLoad(pass, indices, size, trial), /*measurement=*/false,
                                      pass.offset == 0 ? &pass.startBuffers : nullptr);
        pass.stepPeak = std::max(pass.stepPeak, r.peakBytes);
        if (trial || !r.ok) pass.clean = false;
        if (!r.ok) {
            if (repeat) choice.forgetRepeat();  // the trial failed at its second micro-batch
            afterFailure(pass, r, size, trial);
            continue;  // the same samples again, at the size chosen now
        }
        commitMicroBatch(pass, r, slice, weight, batchSize, trial, localSize);
    }
    return true;
}

std::vector<int64_t> Trainer::Impl::nextToLoad(const BatchPass& pass, const std::vector<int64_t>& indices, int64_t size,
                                               bool trial) const {
    const bool ahead = loadsAhead(options.prefetch, hardware.device.kind, torch::get_num_threads(),
                                  options.reservedCpus, feed.cpus);  // the device may have been switched
    if (!ahead || trial || pass.plan.sizes.size() < 2) return {};
    // The next micro-batch is known: load it while this one computes.
    const auto from = indices.begin() + pass.offset + size;
    return {from, from + pass.plan.sizes[1]};
}

void Trainer::Impl::commitMicroBatch(BatchPass& pass, const MicroResult& r, const std::vector<int64_t>& slice,
                                     double weight, int64_t batchSize, bool trial, int64_t localSize) {
    const auto size = static_cast<int64_t>(slice.size());
    choice.succeeded();
    if (trial) {
        // Whether a second micro-batch of the size decides is SizeChoice::trialFit's rule.
        const bool cacheHeld = hardware.meter->reserved() > hardware.meter->allocated();
        if (std::optional<ProbeTrial> decided =
                choice.trialFit(size, r.peakBytes, r.seconds, cacheHeld, now(), r.peakAllocatedBytes)) {
            emit(*decided);
            holdPoint("probe-trial");
        }
    }
    if (!trial && !pass.plan.sizes.empty()) pass.plan.sizes.erase(pass.plan.sizes.begin());
    // After the batch's first micro-batch its copy of the buffers stays resident (startBuffers).
    (trial ? pass.trialPeak : pass.trainingPeak).offer(r, size, pass.offset > 0 ? r.bufferCopyBytes : 0);
    const bool teaching = commands.stepMode();
    MicroBatchDone done{now(), progress.step + 1, pass.committed, pass.offset, size, batchSize, weight, r.loss, trial,
                        {}};
    if (options.reportSampleIndices || teaching) done.sampleIndices = slice;
    if (options.reportGradientNorm || teaching) done.gradientNorm = gradientNorm();
    emit(std::move(done));
    if (!trial && pass.offset + size < localSize) holdPoint("micro-batch");
    pass.lossSum += r.loss * weight;
    pass.largestUsed = std::max(pass.largestUsed, size);
    pass.offset += size;
    ++pass.committed;
    pass.microSeconds += r.seconds;
    if (!trial) {
        if (std::optional<ThroughputTimed> timed = choice.recordTiming(size, r.seconds, now())) emit(*timed);
        if (choice.timingDone()) searchDecided();
    }
    sampleMemory(false);
}

std::optional<SizeChoice::Next> Trainer::Impl::chooseMicroBatch(BatchPass& pass, int64_t remaining) {
    const SizeChoice::Next next = choice.next(pass.plan, remaining);
    switch (next.kind) {
    case SizeChoice::Next::Kind::Train: return next;
    case SizeChoice::Next::Kind::ProbeOver: finishProbe(); return std::nullopt;
    case SizeChoice::Next::Kind::NothingFits:
        if (!nextMemorySavers(0)) doesNotFit(0);
        return std::nullopt;  // a new probe, with memory savers
    }
    return std::nullopt;
}

void Trainer::Impl::afterFailure(BatchPass& pass, const MicroResult& r, int64_t size, bool trial) {
    // An OOM in backward left part of a micro-batch in the accumulators: the batch starts over
    // from its first sample (the same samples, the same weights), so the step is the one a run
    // without the OOM takes.
    const int64_t redone = r.failure.outOfMemory && r.phase == Phase::Backward ? startOver(pass) : 0;
    if (r.failure.outOfMemory && choice.retrySingleSample(size)) {
        // Memory can be taken by others for a moment; retry a single sample before declaring
        // that the model does not fit at all.
        emit(OomEvent{now(), progress.step + 1, r.phase, size, r.failure.requestedBytes, r.failure.message, true, 1,
                      redone, /*snapshotFile=*/{}});
        return;
    }
    if (trial && r.failure.outOfMemory) {
        emit(choice.trialOutOfMemory(size, r.peakBytes, r.failure.requestedBytes, r.seconds, now(),
                                     neededBytes(*hardware.meter, r.failure.requestedBytes)));
    }
    if (!r.failure.outOfMemory) {
        if (size < 2 && needsTwoSamples(r.failure.message) && choice.sizes().minMicroBatch < 2 && upperBound() >= 2) {
            learnTwoSampleMinimum(pass, trial);  // nothing of the failed sample was kept
            return;
        }
        throw FatalError{explainMicroBatchFailure({r.failure.message, size, upperBound(), learner.savers,
                                                   learner.model->checkpointingUnsupported().empty()}),
                         "step " + std::to_string(progress.step + 1) + ", micro-batch " +
                             std::to_string(pass.committed + 1) + " (" + std::to_string(size) + " samples), " +
                             toString(r.phase)};
    }
    shrinkAfterOom(pass, r, size, trial, redone);
    sampleMemory(true);
}

void Trainer::Impl::learnTwoSampleMinimum(BatchPass& pass, bool trial) {
    choice.requireTwoSamples(trial);
    emit(Warning{now(),
                 "the model's BatchNorm cannot train on a single sample (its last feature map is 1x1, one value "
                 "per channel): micro-batches hold at least 2 samples from now on"});
    if (trial)
        startProbe(choice.probeReason(), 2, 0);
    else
        pass.plan = {};
}

void Trainer::Impl::shrinkAfterOom(BatchPass& pass, const MicroResult& r, int64_t size, bool trial, int64_t redone) {
    int64_t next = 0;
    if (trial) {
        next = choice.probe().result();
    } else if (const std::optional<int64_t> smaller = choice.shrinkAfterOom(size)) {
        next = *smaller;
        choice.stopWatchingSpeed();  // no longer the chosen size
        pass.plan = {};
    } else {
        if (!nextMemorySavers(r.failure.requestedBytes)) doesNotFit(r.failure.requestedBytes);
        emit(OomEvent{now(), progress.step + 1, r.phase, size, r.failure.requestedBytes, r.failure.message, true,
                      choice.sizes().minMicroBatch, redone, /*snapshotFile=*/{}});
        pass.plan = {};
        return;  // a new probe, with memory savers
    }
    emit(OomEvent{now(), progress.step + 1, r.phase, size, r.failure.requestedBytes, r.failure.message, true, next,
                  redone, /*snapshotFile=*/{}});
    if (!trial && choice.timing()) {
        // The sizes being timed all fit at the probe; memory was taken since. Keep the best
        // measured so far, never above what just failed.
        finishTiming(choice.abandonTiming(next));
    }
}

void Trainer::Impl::dropPartialBatch(BatchPass& pass) {
    {
        torch::NoGradGuard noGrad;
        CountingScope inPlace(false);
        for (auto& g : learner.gradients) g.zero_();
    }
    restoreBuffers(pass.startBuffers);
}

int64_t Trainer::Impl::startOver(BatchPass& pass) {
    const int64_t redone = pass.offset;
    dropPartialBatch(pass);
    BatchPass fresh;
    fresh.clean = false;
    fresh.stepPeak = pass.stepPeak;
    fresh.startBuffers = std::move(pass.startBuffers);
    pass = std::move(fresh);
    return redone;
}

void Trainer::Impl::halveLossScale(int64_t samples) {
    const double scale = learner.lossScaler.scale();
    const std::optional<LossScaler::Change> lower = learner.lossScaler.overflowed();
    if (!lower) {
        throw FatalError{formatText("the gradients are not finite even at loss scale %g under float16 autocast "
                                    "(memory savers %s): the backward pass itself produces inf or NaN; train "
                                    "with bf16 or without the float16 savers, or lower the learning rate",
                                    scale, toString(learner.savers)),
                         "step " + std::to_string(progress.step + 1)};
    }
    emit(LossScaleChanged{now(), progress.step + 1, lower->from, lower->to, true, samples});
}

void Trainer::Impl::finishStep(const BatchPass& pass, const std::vector<int64_t>& indices, int64_t batchSize,
                               Clock::time_point stepStart, double computeSeconds, int64_t plannedLocal) {
    optimizerStep();
    ++progress.step;
    progress.samplesSeen += batchSize;
    if (autocastsFp16(learner.savers))
        if (const std::optional<LossScaler::Change> grown = learner.lossScaler.stepped())
            emit(LossScaleChanged{now(), progress.step, grown->from, grown->to, false, 0});
    if (parallel) finishRanksStep();
    const double seconds = std::chrono::duration<double>(timingNow() - stepStart).count();
    if (pass.clean)
        choice.stepCosts.observe(pass.committed, pass.microSeconds, computeSeconds - pass.waitSeconds,
                                 seconds - pass.waitSeconds);
    emit(OptimizerStepped{now(), progress.step, pass.committed});
    emit(StepMetrics{now(), progress.step, feed.sampler->epoch(), progress.samplesSeen, pass.lossSum, pass.largestUsed,
                     choice.sizes().microBatch > 0 && !choice.timing()
                         ? static_cast<int64_t>(planFor(plannedLocal, choice.sizes().microBatch).size())
                         : pass.committed,
                     // With several devices the plan above is this rank's share's, and so is its total.
                     parallel ? plannedLocal : progress.target, learner.optimizer->learningRate(),
                     seconds > 0 ? static_cast<double>(batchSize) / seconds : 0.0, seconds, pass.stepPeak,
                     totalSteps()});
    sampleMemory(true);
    reportBreakdown();
    warnAboutAllocatorRetries();
    // This process's own speed: with several devices, without the wait for the other ranks; never
    // the time it waited for the user (a pause, step mode's Advance).
    const auto localSize = static_cast<int64_t>(indices.size());
    const double ownSeconds = (parallel ? computeSeconds : seconds) - pass.waitSeconds;
    // A full training batch, planned at one size (its even split: with --multiple-of no part need
    // have the size itself), is what the check's turns and the drift watch compare.
    const bool fullBatch = localSize == plannedLocal && batchSize == progress.target && ownSeconds > 0;
    const double ownRate = fullBatch ? static_cast<double>(localSize) / ownSeconds : 0;
    if (fullBatch && pass.checkSize > 0 && pass.clean && pass.plan.plannedFor == pass.checkSize) {
        // At the size a check wanted: its turns, and its decision.
        if (std::optional<ThroughputChecked> turn = choice.recordBatch(pass.checkSize, ownRate, ownSeconds, now()))
            emit(*turn);
        if (choice.timingDone()) finishTiming(choice.search().chosen());
    } else if (fullBatch && pass.plan.plannedFor == choice.sizes().microBatch) {
        if (std::optional<std::string> why = choice.watchSpeed(ownRate)) {
            emit(Warning{now(), *why});
            startTiming(choice.sizes().probed, choice.sizes().microBatch);  // from the size in use, which just ran
        }
    }
    progress.lastBatch = indices;
    commands.batchDone();
    if (checkpointer.dueAfter(progress.step)) writeCheckpoint();
    if (!choice.probing() && choice.cleanStep(options.regrowAfterSteps))
        startProbe(ProbeReason::Regrow, choice.sizes().microBatch, choice.sizes().microBatch);
}

void Trainer::Impl::warnAboutAllocatorRetries() {
    const int64_t retries = hardware.meter->allocatorRetries();
    const int64_t ooms = hardware.meter->allocatorOoms();
    // A caching allocator retries once before each OOM it raises; those retries are the OOMs the
    // step already reported and recovered from, not fragmentation that cost time in a step that
    // went through. (An exact budget raises OOMs without retrying: never below zero.)
    const int64_t during =
        std::max<int64_t>(0, (retries - hardware.reported.allocatorRetries) - (ooms - hardware.reported.allocatorOoms));
    hardware.reported.allocatorRetries = retries;
    hardware.reported.allocatorOoms = ooms;
    // Retries in consecutive steps at a settled size are thrashing: each flushes the whole cache
    // and costs the time of reserving it again. The micro-batch shrinks as after an OOM; nothing
    // is lost, since the step itself went through.
    const int64_t before = choice.sizes().microBatch;
    if (choice.thrashing(during, choice.settled())) {
        if (const std::optional<int64_t> smaller = choice.shrinkAfterOom(before)) {
            choice.stopWatchingSpeed();
            emit(Warning{now(), "the caching allocator had to free its cache and retry allocations in " +
                                    std::to_string(MicroBatchSizes::kThrashingSteps) + " steps in a row (" +
                                    std::to_string(during) + " in step " + std::to_string(progress.step) +
                                    "): memory is fragmented at micro-batch " + std::to_string(before) +
                                    ", so it goes down to " + std::to_string(*smaller) +
                                    " as after an out-of-memory error"});
            return;
        }
    }
    if (during <= 0) return;
    emit(Warning{now(),
                 "the caching allocator had to free its cache and retry " + std::to_string(during) +
                     " allocation(s) during step " + std::to_string(progress.step) +
                     ": device memory is fragmented; a larger --headroom leaves it room (each retry costs time)"});
}

Trainer::Trainer(TrainerOptions options, EventSink& sink) : m_impl(std::make_unique<Impl>(std::move(options), sink)) {
    installCountingAllocator();
}

Trainer::~Trainer() = default;

void Trainer::Impl::trainUntilDone() {
    while (!limitReached()) {
        if (parallel) {
            // Every rank takes the same decision at the same batch, or none would go on; a
            // pause too: a rank that waited on its own would leave the others in a collective.
            const bool here = !applyCommands();
            if (ranksAgree(here)) break;
            if (holdWhilePaused()) continue;  // the commands given meanwhile, agreed again
            const std::vector<int64_t> batch = feed.sampler->next(progress.target);
            trainBatch(rankSlice(batch), static_cast<int64_t>(batch.size()));
            parallel->lastBatch = batch;
        } else {
            if (!applyCommands() || !waitWhilePaused()) break;
            const std::vector<int64_t> batch = feed.sampler->next(progress.target);
            trainBatch(batch, static_cast<int64_t>(batch.size()));
            if (commands.stopRequested()) break;
        }
        // With several devices rank 0 evaluates (it keeps the checkpoints); the others wait for
        // it here as long as its heartbeat goes on, however long the pass takes.
        if (validationDue()) {
            if (!leads()) {
                awaitValidation();
            } else {
                runValidation();
                if (parallel) parallel->link->markDone("validated/" + std::to_string(progress.step));
            }
        }
    }
}

void Trainer::Impl::endRun(RunResult& result) {
    result.stopped = commands.stopRequested() || (parallel && parallel->stoppedByRanks);
    if (parallel) checkRanksAgree();  // at the end of every run, whatever the interval
    std::optional<int64_t> equivalence = commands.takeEquivalence();
    // A check asked for during the last batch still runs: the user is waiting for it (with
    // several devices, asked for on any rank, on every rank together).
    if (parallel) equivalence = agreeOnEquivalence(equivalence, result.stopped);
    if (equivalence && !result.stopped) checkEquivalence(*equivalence);
    // The end of the run is always evaluated (a stop asked for by the user is not held up by it).
    if (!result.stopped && leads() && feed.validation.data && progress.step > 0 &&
        feed.validation.lastStep != progress.step)
        runValidation();
    // A stop asked for during that pass dropped it: the run was stopped, not done.
    result.stopped = result.stopped || commands.stopRequested();
    if (result.stopped) setState(RunState::Stopping);
    learner.reservation.clear();
    // Saved already at this step (an interval, re-saved after a new best model), or not.
    if (checkpointer.dueAtEnd(progress.step)) writeCheckpoint();
}

RunResult Trainer::run() {
    Impl& d = *m_impl;
    CountingScope counting(true);
    d.progress.start = Clock::now();
    RunResult result;
    d.setState(RunState::Starting, d.options.device);
    try {
        d.setup();
        d.reportSummary();
        d.sampleMemory(true);
        d.reportBreakdown();
        if (d.choice.sizes().microBatch == 0) {
            d.startProbe(ProbeReason::Initial, d.options.probe.initialMicroBatch, 0);
        } else {
            d.setState(RunState::Training, "micro-batch " + std::to_string(d.choice.sizes().microBatch));
        }
        d.trainUntilDone();
        d.endRun(result);
        // The last checkpoint is written: the folder is free for the next run (this process's
        // too) before anyone hears that this one ended.
        d.checkpointer.release();
        result.state = RunState::Finished;
        d.setState(RunState::Finished, result.stopped ? "stopped" : "done");
    } catch (const LoadingCancelled&) {
        // Stopped while loading: nothing was trained, nothing to save.
        d.checkpointer.release();
        result.state = RunState::Finished;
        result.stopped = true;
        d.setState(RunState::Finished, "stopped while loading the data");
    } catch (const FatalError& e) {
        d.checkpointer.release();
        result.state = RunState::Failed;
        result.error = e.message;
        result.badInput = e.kind == FailureKind::BadInput;
        d.emit(ErrorEvent{d.now(), e.message, e.where});
        d.setState(RunState::Failed, e.message);
        if (d.parallel && !e.otherRankFailed) d.parallel->link->reportFailure(e.message);
    } catch (const std::exception& e) {
        d.checkpointer.release();
        const FailureInfo failure = classifyFailure(std::current_exception());
        result.state = RunState::Failed;
        result.error = failure.message;
        if (d.parallel) d.parallel->link->reportFailure(failure.message);
        d.emit(ErrorEvent{d.now(), failure.message, "step " + std::to_string(d.progress.step + 1)});
        d.setState(RunState::Failed, failure.message);
    }
    result.steps = d.progress.step;
    result.checkpointError = d.checkpointer.lastError();
    // A run that ended while probing reports the largest size that fit so far.
    result.microBatch = d.choice.currentSize();
    d.choice.abandonProbe();
    d.learner.reservation.clear();
    return result;
}

void Trainer::pause() {
    m_impl->commands.pause();
}
void Trainer::resume() {
    m_impl->commands.resume();
}
void Trainer::stop() {
    m_impl->commands.stop();
}
void Trainer::reprobe() {
    m_impl->commands.reprobe();
}
void Trainer::switchDevice(const std::string& device, int rank) {
    m_impl->commands.switchDevice(device, rank);
}
void Trainer::setStepMode(bool on) {
    m_impl->commands.setStepMode(on);
}
void Trainer::advance() {
    m_impl->commands.advance();
}
void Trainer::finishBatch() {
    m_impl->commands.finishBatch();
}
void Trainer::checkEquivalence(int64_t samples) {
    m_impl->commands.checkEquivalence(samples);
}
void Trainer::surveySavers() {
    m_impl->commands.surveySavers();
}
void Trainer::setMemorySavers(MemorySavers savers) {
    if (savers != MemorySavers::Auto) m_impl->commands.setMemorySavers(savers);
}

void Trainer::setTargetBatch(int64_t target, std::optional<LrScaling> rule) {
    if (target > 0) m_impl->commands.setTarget(target, rule.value_or(m_impl->options.lrScaling));
}

std::shared_ptr<Model> Trainer::model() const {
    return m_impl->learner.model;
}

}  // namespace batchpilot::core
