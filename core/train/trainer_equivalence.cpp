// The trainer's equivalence check: accumulated micro-batch gradients against one full pass over
// the same samples, computed with training's own code (core/train/equivalence.h compares them).

#include "core/config/run_config.h"
#include "core/train/trainer_impl.h"

namespace batchpilot::core {

void Trainer::Impl::checkEquivalence(int64_t requested) {
    EquivalenceChecked r;
    r.step = step;
    const auto started = Clock::now();
    const auto finish = [&] {
        meter->releaseCache();
        if (!leads()) return;  // several devices: rank 0 reports the job's check
        r.time = now();
        r.seconds = std::chrono::duration<double>(Clock::now() - started).count();
        emit(std::move(r));
    };
    // With several devices the whole training batch (every rank's samples), as the sampler gave it.
    std::vector<int64_t> indices = parallel ? parallel->lastBatch : lastBatch;
    if (indices.empty()) {
        Sampler peek = *sampler;  // before the first step: the batch about to be trained
        indices = peek.next(target);
    }
    const auto whole = static_cast<int64_t>(indices.size());
    int64_t n = requested > 0 && requested < whole ? requested : whole;
    if (parallel) n = std::min(whole, std::max(n, parallel->link->size() * minPart));  // every rank a part
    indices.resize(static_cast<size_t>(n));
    r.samples = n;
    r.batchStatistics = model->usesBatchStatistics();
    r.bfloat16 = autocastsBf16(savers);
    r.float16 = autocastsFp16(savers);
    // This rank's part: with several devices, the share of the n samples training would give it.
    const std::vector<int64_t> part = parallel ? rankSlice(indices) : indices;
    const auto mine = static_cast<int64_t>(part.size());
    const int64_t micro = microBatch > 0 ? microBatch : (probe ? probe->result() : 0);
    std::string problem;
    if (micro <= 0) {
        problem = "no micro-batch size is known yet: check again once the probe has chosen one";
    } else if (mine > 0) {
        // The current plan; a part no larger than the micro-batch is split in up to four
        // micro-batches so that accumulation has something to show.
        r.microBatchSizes = planFor(mine, micro < mine ? micro : std::max<int64_t>(minPart, (mine + 3) / 4));
    }

    /// Restores training mode whatever happens in the BatchNorm comparison.
    struct TrainModeGuard {
        Model& model;
        ~TrainModeGuard() { model.train(true); }
    };
    const torch::Device where = parameters.front().device();
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
                                     device.name() +
                                     " in one pass next to the training state; choose a check "
                                     "batch of at most about " +
                                     std::to_string(micro) + " samples (the micro-batch that fits)");
        }
        if (outside != nullptr) *outside = true;
        CountingScope uncounted(false);
        return pass();
    };
    // Training mode, and for a BatchNorm model also evaluation mode, which normalises each sample
    // with the running statistics: no sample depends on its neighbours, which isolates what the
    // batch statistics cause. Every rank accumulates both before any comparison, so that the
    // ranks meet at the same exchanges whatever fails where.
    const size_t modes = r.batchStatistics ? 2 : 1;
    std::vector<std::vector<torch::Tensor>> accumulated(modes);
    if (problem.empty()) {
        try {
            TrainModeGuard restore{*model};
            for (size_t m = 0; m < modes; ++m) {
                model->train(m == 0);
                accumulated[m] = guarded([&] { return accumulateAsTraining(part, r.microBatchSizes, n); }, nullptr);
            }
        } catch (const std::exception&) {
            problem = "the equivalence check could not run: " + classifyFailure(std::current_exception()).message;
        }
    }
    if (parallel) {
        // Every rank's plan and problem, then the parts' sum, as a training step sums them.
        ProcessGroupLink& link = *parallel->link;
        const std::string round = "equivalence/" + std::to_string(++parallel->equivalenceChecks);
        std::vector<std::string> all;
        try {
            all = link.exchangeText(round, jsonText(nlohmann::json{{"plan", r.microBatchSizes}, {"problem", problem}}));
        } catch (const std::exception& e) {
            ranksFailed(e, "checking the equivalence together");
        }
        problem.clear();
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
            if (problem.empty() && !theirs.empty())
                problem = "rank " + std::to_string(k) + " (" + parallel->devices[k] + "): " + theirs;
        }
        if (problem.empty()) {
            try {
                torch::NoGradGuard noGrad;
                for (auto& gradients : accumulated) link.allReduceSum(gradients);
            } catch (const std::exception& e) {
                ranksFailed(e, "summing the equivalence check's gradients");
            }
        }
    }
    if (!problem.empty() || !leads()) {
        r.error = problem;
        return finish();
    }
    try {
        Batch host;
        {
            CountingScope uncounted(false);
            host = data->get(indices);
        }
        const torch::Tensor inputs = where.is_cuda() ? host.inputs.to(where) : host.inputs;
        const torch::Tensor targets = where.is_cuda() ? host.targets.to(where) : host.targets;
        TrainModeGuard restore{*model};
        for (size_t m = 0; m < modes; ++m) {
            model->train(m == 0);
            EquivalenceChecked running;
            EquivalenceChecked& into = m == 0 ? r : running;
            auto full = guarded(
                [&] {
                    AutocastScope autocast(where.type(), forwardAutocast());  // as training runs it
                    return fullBatchGradient(*model, inputs, targets, options.loss, backwardScale());
                },
                &r.fullPassOutsideBudget);
            compareGradients(model->parameterNames(), accumulated[m], full, into);
            if (m == 1) r.runningStatisticsRelativeDifference = running.overall.relativeDifference;
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
    for (const auto& g : gradients) accumulated.push_back(g / backwardScale());
    return accumulated;
}

}  // namespace batchpilot::core
