// The trainer's validation pass: the held-out data (core/train/validation.h) evaluated without
// gradients, in eval mode, at a micro-batch of its own that grows while memory allows and halves
// on an out-of-memory error (core/plan/validation_sizes.h). Training's state is not changed.

#include <numeric>

#include "core/train/trainer_impl.h"
#include "core/train/validation.h"

namespace batchpilot::core {
namespace {

/// Puts the model in eval mode for the pass and back in training mode however the pass ends.
struct EvalMode {
    explicit EvalMode(Model& m) : model(m) { model.train(false); }
    ~EvalMode() { model.train(true); }
    EvalMode(const EvalMode&) = delete;
    EvalMode& operator=(const EvalMode&) = delete;
    Model& model;
};

}  // namespace

bool Trainer::Impl::validationDue() const {
    if (!feed.validation.data || progress.step == 0 || progress.step == feed.validation.lastStep) return false;
    if (options.validation.everySteps) return progress.step % *options.validation.everySteps == 0;
    return feed.sampler->completedEpochs() > feed.validation.epochs;
}

std::exception_ptr Trainer::Impl::evaluate(const std::vector<int64_t>& indices, ValidationTotals& totals) {
    try {
        torch::NoGradGuard noGrad;
        Batch host;
        {
            CountingScope hostMemory(false);  // read into host memory, as the prefetcher does
            host = feed.validation.data->get(indices);
        }
        const torch::Device where = learner.parameters.front().device();
        torch::Tensor inputs = where.is_cuda() ? host.inputs.to(where) : host.inputs.clone();
        torch::Tensor targets = where.is_cuda() ? host.targets.to(where) : host.targets.clone();
        host = Batch{};
        totals.add(learner.model->forward(inputs), targets);
        return nullptr;
    } catch (const std::exception&) {
        return std::current_exception();
    }
}

void Trainer::Impl::validationFailed(const std::exception_ptr& error, int64_t size, int64_t offset) {
    const FailureInfo failure = classifyFailure(error);
    if (!failure.outOfMemory) {
        throw FatalError{"validation failed: " + failure.message,
                         "validation after step " + std::to_string(progress.step) + " (" + std::to_string(size) +
                             " held-out samples from position " + std::to_string(offset) + ")"};
    }
    hardware.meter->releaseCache();
    if (!feed.validation.sizes.outOfMemory(size)) {
        throw FatalError{"validation does not fit on " + hardware.device.name() +
                             " even one sample at a time, next to training's memory: " + failure.message,
                         "validation after step " + std::to_string(progress.step)};
    }
    emit(OomEvent{now(), progress.step, Phase::Validation, size, failure.requestedBytes, failure.message, true,
                  feed.validation.sizes.size(), /*redoneSamples=*/0, /*snapshotFile=*/{}});
    sampleMemory(true);
}

void Trainer::Impl::runValidation() {
    const auto started = Clock::now();
    const int64_t total = feed.validation.data->size();
    const int64_t training = choice.sizes().microBatch > 0 ? choice.sizes().microBatch : choice.sizes().probed;
    feed.validation.sizes.begin(total, training);
    ValidationTotals totals(options.loss);
    int ooms = 0;
    int64_t largest = 0;
    int64_t offset = 0;
    EvalMode eval(*learner.model);
    while (offset < total) {
        if (commands.stopRequested()) return;  // stopping: the pass is dropped, nothing was changed
        const int64_t n = std::min(feed.validation.sizes.size(), total - offset);
        std::vector<int64_t> indices(static_cast<size_t>(n));
        std::iota(indices.begin(), indices.end(), offset);
        const int64_t resident = hardware.meter->allocated();
        const int64_t cached = hardware.meter->reserved();
        hardware.meter->resetPeak();
        if (const std::exception_ptr error = evaluate(indices, totals)) {
            validationFailed(error, n, offset);
            ++ooms;
            continue;
        }
        offset += n;
        largest = std::max(largest, n);
        // What the micro-batch itself took: the tensors it added, or what the allocator had to
        // reserve beyond its cache for them, whichever is more. Not peakReserved() - resident:
        // under a caching allocator that counts all of training's cache, which fills the memory
        // after a probe, and the pass never grew (seen: 819 held-out samples evaluated one at a
        // time, 8 s a pass, on virtual:3GiB).
        const int64_t activations =
            std::max<int64_t>({0, hardware.meter->peak() - resident, hardware.meter->peakReserved() - cached});
        feed.validation.sizes.ran(n, resident, activations, usableBytes());
        sampleMemory(false);
    }
    feed.validation.sizes.end();
    feed.validation.lastStep = progress.step;
    feed.validation.epochs = feed.sampler->completedEpochs();
    ValidationDone done = totals.done();
    done.time = now();
    done.step = progress.step;
    done.epoch = feed.sampler->completedEpochs();
    done.samplesSeen = progress.samplesSeen;
    done.microBatch = largest;
    done.ooms = ooms;
    done.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    emit(done);
    keepBestModel(done);
    sampleMemory(true);
}

}  // namespace batchpilot::core
