// The trainer's equivalence check: accumulated micro-batch gradients against one full pass over
// the same samples, computed with training's own code (core/equivalence.h compares them).

#include "core/trainer_impl.h"

namespace batchpilot::core {

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
    if (requested > 0 && requested < static_cast<int64_t>(indices.size()))
        indices.resize(static_cast<size_t>(requested));
    const auto n = static_cast<int64_t>(indices.size());
    r.samples = n;
    r.batchStatistics = model->usesBatchStatistics();
    r.bfloat16 = autocastsBf16(savers);
    r.float16 = autocastsFp16(savers);
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
                                         device.name() +
                                         " in one pass next to the training state; choose a check "
                                         "batch of at most about " +
                                         std::to_string(micro) + " samples (the micro-batch that fits)");
            }
            if (outside != nullptr) *outside = true;
            CountingScope uncounted(false);
            return pass();
        };
        const auto compare = [&](EquivalenceChecked& into) {
            auto accumulated = guarded([&] { return accumulateAsTraining(indices, into.microBatchSizes); }, nullptr);
            auto full = guarded(
                [&] {
                    AutocastScope autocast(where.type(), forwardAutocast());  // as training runs it
                    return fullBatchGradient(*model, inputs, targets, options.loss, backwardScale());
                },
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
