// The trainer's equivalence check: accumulated micro-batch gradients against one full pass over
// the same samples, computed with training's own code (core/train/equivalence.h compares them).

#include "core/config/run_config.h"
#include "core/nn/activation_checkpoint.h"
#include "core/train/trainer_impl.h"

namespace batchpilot::core {

void Trainer::Impl::checkEquivalence(int64_t requested) {
    EquivalenceChecked r;
    r.step = progress.step;
    const auto started = Clock::now();
    CheckBatch check = chooseCheckBatch(requested, r);
    std::vector<std::vector<torch::Tensor>> accumulated = accumulateForCheck(check, r);
    if (parallel) sumCheckOverRanks(check, r, accumulated);
    if (check.problem.empty() && leads()) {
        compareWithFullBatch(check, r, accumulated);
    } else {
        r.error = check.problem;
    }
    hardware.meter->releaseCache();
    if (!leads()) return;  // several devices: rank 0 reports the job's check
    r.time = now();
    r.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    emit(std::move(r));
}

Trainer::Impl::CheckBatch Trainer::Impl::chooseCheckBatch(int64_t requested, EquivalenceChecked& r) {
    CheckBatch check;
    // With several devices the whole training batch (every rank's samples), as the sampler gave it.
    check.indices = parallel ? parallel->lastBatch : progress.lastBatch;
    if (check.indices.empty()) {
        Sampler peek = *feed.sampler;  // before the first step: the batch about to be trained
        check.indices = peek.next(progress.target);
    }
    const auto whole = static_cast<int64_t>(check.indices.size());
    int64_t n = requested > 0 && requested < whole ? requested : whole;
    if (parallel)
        n = std::min(whole, std::max(n, parallel->link->size() * choice.sizes().minPart));  // every rank a part
    check.indices.resize(static_cast<size_t>(n));
    check.samples = n;
    r.samples = n;
    r.batchStatistics = learner.model->usesBatchStatistics();
    r.bfloat16 = autocastsBf16(learner.savers);
    r.float16 = autocastsFp16(learner.savers);
    // This rank's part: with several devices, the share of the n samples training would give it.
    check.part = parallel ? rankSlice(check.indices) : check.indices;
    const auto mine = static_cast<int64_t>(check.part.size());
    check.microBatch = choice.currentSize();
    if (check.microBatch <= 0) {
        check.problem = "no micro-batch size is known yet: check again once the probe has chosen one";
    } else if (mine > 0) {
        // The current plan; a part no larger than the micro-batch is split in up to four
        // micro-batches so that accumulation has something to show.
        r.microBatchSizes =
            planFor(mine, check.microBatch < mine ? check.microBatch
                                                  : std::max<int64_t>(choice.sizes().minPart, (mine + 3) / 4));
    }
    return check;
}

std::vector<torch::Tensor> Trainer::Impl::checkPass(const CheckBatch& check,
                                                    const std::function<std::vector<torch::Tensor>()>& pass,
                                                    bool* outside) {
    std::exception_ptr error;
    try {
        return pass();
    } catch (const std::exception&) {
        error = std::current_exception();
    }
    const FailureInfo failure = classifyFailure(error);
    hardware.meter->releaseCache();
    if (!failure.outOfMemory) std::rethrow_exception(error);
    if (learner.parameters.front().device().is_cuda()) {
        throw std::runtime_error("the check batch of " + std::to_string(check.samples) + " samples does not fit on " +
                                 hardware.device.name() +
                                 " in one pass next to the training state; choose a check batch of at most about " +
                                 std::to_string(check.microBatch) + " samples (the micro-batch that fits)");
    }
    if (outside != nullptr) *outside = true;
    CountingScope uncounted(false);
    return pass();
}

namespace {
/// Restores training mode whatever happens in the BatchNorm comparison.
struct TrainModeGuard {
    Model& model;
    ~TrainModeGuard() { model.train(true); }
};
}  // namespace

std::vector<std::vector<torch::Tensor>> Trainer::Impl::accumulateForCheck(CheckBatch& check,
                                                                          const EquivalenceChecked& r) {
    // Training mode, and for a BatchNorm model also evaluation mode, which normalises each sample
    // with the running statistics: no sample depends on its neighbours, which isolates what the
    // batch statistics cause. Every rank accumulates both before any comparison, so that the
    // ranks meet at the same exchanges whatever fails where.
    std::vector<std::vector<torch::Tensor>> accumulated(r.batchStatistics ? 2 : 1);
    if (!check.problem.empty()) return accumulated;
    try {
        TrainModeGuard restore{*learner.model};
        for (size_t m = 0; m < accumulated.size(); ++m) {
            learner.model->train(m == 0);
            accumulated[m] = checkPass(
                check, [&] { return accumulateAsTraining(check.part, r.microBatchSizes, check.samples); }, nullptr);
        }
    } catch (const std::exception&) {
        check.problem = "the equivalence check could not run: " + classifyFailure(std::current_exception()).message;
    }
    return accumulated;
}

void Trainer::Impl::sumCheckOverRanks(CheckBatch& check, EquivalenceChecked& r,
                                      std::vector<std::vector<torch::Tensor>>& accumulated) {
    // Every rank's plan and problem, then the parts' sum, as a training step sums them.
    ProcessGroupLink& link = *parallel->link;
    const std::string round = "equivalence/" + std::to_string(++parallel->equivalenceChecks);
    std::vector<std::string> all;
    try {
        all =
            link.exchangeText(round, jsonText(nlohmann::json{{"plan", r.microBatchSizes}, {"problem", check.problem}}));
    } catch (const std::exception& e) {
        ranksFailed(e, "checking the equivalence together");
    }
    check.problem.clear();
    r.rankDevices = parallel->devices;
    for (size_t k = 0; k < all.size(); ++k) {
        const nlohmann::json said = nlohmann::json::parse(all[k], nullptr, false);
        const bool readable = said.is_object() && said.contains("plan") && said["plan"].is_array() &&
                              said.contains("problem") && said["problem"].is_string();
        std::vector<int64_t> plan;
        if (readable)
            for (const nlohmann::json& size : said["plan"])
                if (size.is_number_integer()) plan.push_back(size.get<int64_t>());
        r.rankMicroBatchSizes.push_back(std::move(plan));
        const std::string theirs = readable ? said["problem"].get<std::string>() : "its answer cannot be read";
        if (check.problem.empty() && !theirs.empty())
            check.problem = "rank " + std::to_string(k) + " (" + parallel->devices[k] + "): " + theirs;
    }
    if (!check.problem.empty()) return;
    try {
        torch::NoGradGuard noGrad;
        for (auto& gradients : accumulated) link.allReduceSum(gradients);
    } catch (const std::exception& e) {
        ranksFailed(e, "summing the equivalence check's gradients");
    }
}

void Trainer::Impl::compareWithFullBatch(const CheckBatch& check, EquivalenceChecked& r,
                                         const std::vector<std::vector<torch::Tensor>>& accumulated) {
    const torch::Device where = learner.parameters.front().device();
    try {
        Batch host;
        {
            CountingScope uncounted(false);
            host = feed.training->get(check.indices);
        }
        const torch::Tensor inputs = where.is_cuda() ? host.inputs.to(where) : host.inputs;
        const torch::Tensor targets = where.is_cuda() ? host.targets.to(where) : host.targets;
        TrainModeGuard restore{*learner.model};
        for (size_t m = 0; m < accumulated.size(); ++m) {
            learner.model->train(m == 0);
            EquivalenceChecked running;
            EquivalenceChecked& into = m == 0 ? r : running;
            auto full = checkPass(
                check,
                [&] {
                    AutocastScope autocast(where.type(), forwardAutocast());  // as training runs it
                    return fullBatchGradient(*learner.model, inputs, targets, options.loss, backwardScale());
                },
                &r.fullPassOutsideBudget);
            compareGradients(learner.model->parameterNames(), accumulated[m], full, into);
            if (m == 1) r.runningStatisticsRelativeDifference = running.overall.relativeDifference;
        }
        r.explanation = explainEquivalence(r);
    } catch (const std::exception&) {
        const FailureInfo failure = classifyFailure(std::current_exception());
        r.tensors.clear();
        r.error = "the equivalence check could not run: " + failure.message;
    }
}

std::vector<torch::Tensor> Trainer::Impl::accumulateAsTraining(const std::vector<int64_t>& indices,
                                                               const std::vector<int64_t>& microBatchSizes,
                                                               int64_t batchSize) {
    // Training's own path: runMicroBatch adds each micro-batch's weighted gradient to the
    // accumulators, exactly as a step does. What training had there, the buffers (BatchNorm
    // statistics) and the CPU random state are put back afterwards, so training goes on as if
    // the check had not run.
    std::vector<torch::Tensor> kept, buffers;
    {
        torch::NoGradGuard noGrad;
        CountingScope uncounted(false);
        for (auto& g : learner.gradients) {
            kept.push_back(g.clone());
            g.zero_();
        }
        for (const auto& b : learner.model->buffers()) buffers.push_back(b.clone());
    }
    const torch::Tensor randomState = cpuGeneratorState();
    struct Restore {
        Impl& impl;
        std::vector<torch::Tensor>& kept;
        std::vector<torch::Tensor>& buffers;
        const torch::Tensor& randomState;
        ~Restore() {
            torch::NoGradGuard noGrad;
            for (size_t i = 0; i < kept.size(); ++i) impl.learner.gradients[i].copy_(kept[i]);
            auto now = impl.learner.model->buffers();
            for (size_t i = 0; i < buffers.size() && i < now.size(); ++i) now[i].copy_(buffers[i]);
            setCpuGeneratorState(randomState);
        }
    } restore{*this, kept, buffers, randomState};

    const auto total = static_cast<double>(batchSize);
    size_t offset = 0;
    for (const int64_t size : microBatchSizes) {
        const std::vector<int64_t> slice(
            indices.begin() + static_cast<std::ptrdiff_t>(offset),
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
    // float16 autocast scaled the loss for backward, as in training; the full pass did not.
    for (const auto& g : learner.gradients) accumulated.push_back(g / backwardScale());
    return accumulated;
}

}  // namespace batchpilot::core
