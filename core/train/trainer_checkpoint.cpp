// The trainer's checkpoints: saving one, and restoring a run from one (core/train/checkpoint.h writes
// and reads the file).

#include <filesystem>

#include "core/train/trainer_impl.h"

namespace batchpilot::core {

void Trainer::Impl::writeCheckpoint(const std::string& metric, double value) {
    if (!leads()) return;  // several devices: rank 0 writes (every rank holds the same parameters)
    TrainerState saved;
    saved.step = progress.step;
    saved.samplesSeen = progress.samplesSeen;
    saved.samplerEpoch = feed.sampler->epoch();
    saved.samplerPosition = feed.sampler->position();
    // A batch that ended an epoch leaves the position at its end: the next one starts a new epoch.
    if (feed.sampler->position() >= feed.training->size()) {
        saved.samplerEpoch = feed.sampler->completedEpochs();
        saved.samplerPosition = 0;
    }
    saved.targetBatch = progress.target;
    saved.microBatch = choice.sizes().microBatch;
    saved.learningRate = learner.optimizer->learningRate();
    saved.device = hardware.device.name();
    saved.modelName = learner.model->name();
    saved.trainingSamples = feed.training->size();
    saved.lossScale = autocastsFp16(learner.savers) ? learner.lossScaler.scale() : 0.0;
    saved.dataFingerprint = feed.training->fingerprint();
    saved.loss = toString(options.loss);
    saved.seed = options.seed;
    emit(checkpointer.save(std::move(saved), *learner.model, *learner.optimizer, now(), metric, value));
}

void Trainer::Impl::keepBestModel(const ValidationDone& done) {
    const std::optional<double> best = checkpointer.newBest(done);
    if (!best) return;
    writeCheckpoint(checkpointer.keptMetric(), *best);
    // A latest checkpoint written at this step (an interval that ends here) was saved before
    // this validation: save it again, so that it records the new best value for a resumed run.
    if (checkpointer.latestSavedAt(progress.step)) writeCheckpoint();
}

void Trainer::Impl::restoreCheckpoint() {
    const int64_t beforeState = hardware.meter->allocated();
    auto resumed = loadCheckpoint(options.resumeFrom, *learner.model, *learner.optimizer);
    if (!resumed) throw badInput(resumed.error(), "resume");
    checkResumedSamples(*resumed);
    checkResumedRun(*resumed);
    if (learner.optimizer->stateReady())
        hardware.ledger.optimizerStateBytes = std::max<int64_t>(0, hardware.meter->allocated() - beforeState);
    checkpointer.resume(*resumed);
    // float16 autocast goes on at the scale it had reached (a fresh scale could overflow and
    // redo the first batch, rounding its gradients otherwise than the uninterrupted run).
    learner.lossScaler.resume(resumed->lossScale);
    progress.step = resumed->step;
    progress.samplesSeen = resumed->samplesSeen;
    feed.sampler->restore(resumed->samplerEpoch, resumed->samplerPosition);
    progress.target = resumed->targetBatch;
    if (resumed->device == hardware.device.name() && !options.parallel) {
        // Known to fit here: continue without probing; an OOM would still shrink it.
        choice.resumeAt(std::min(resumed->microBatch, upperBound()));
    }
    emit(RunStateChanged{now(), RunState::Starting,
                         "resumed from step " + std::to_string(progress.step) + " of " + options.resumeFrom +
                             ", at the checkpoint's target batch " + std::to_string(progress.target)});
}

void Trainer::Impl::checkResumedSamples(const TrainerState& resumed) {
    // The sampler's position counts samples of the training set: on another set (another data
    // file, or another held-out share) it would skip or repeat samples without a word.
    if (resumed.trainingSamples >= 0 && resumed.trainingSamples != feed.training->size()) {
        throw badInput("the checkpoint in " + options.resumeFrom + " was written while training on " +
                           std::to_string(resumed.trainingSamples) + " samples, but this run trains on " +
                           std::to_string(feed.training->size()) +
                           " (other data, or another --validation-split or --validation-data): resume with "
                           "the data and validation options of the run that wrote it, or start a new run",
                       "resume");
    }
    // Checked against the samples the checkpoint records when it records them; here against this
    // run's, which an older checkpoint's must be: a position past them was taken for the end.
    const int64_t samples = feed.training->size();
    const std::string edited = ": the file was edited or damaged; resume from an intact checkpoint or start a new run";
    if (resumed.samplerPosition > samples) {
        throw badInput("the checkpoint in " + options.resumeFrom + " holds sampler_position " +
                           std::to_string(resumed.samplerPosition) + ", past the " + std::to_string(samples) +
                           " samples this run trains on" + edited,
                       "resume");
    }
    // A training batch uses each sample at most once, as when the run started.
    if (resumed.targetBatch > samples) {
        throw badInput("the checkpoint in " + options.resumeFrom + " holds target_batch " +
                           std::to_string(resumed.targetBatch) + ", larger than the data: " + feed.training->name() +
                           " has " + std::to_string(samples) + " samples" + edited,
                       "resume");
    }
    // Only a share held out of the data itself changed the training set: synthetic data gets
    // extra samples of its own, and --validation-data leaves the training file whole.
    if (resumed.trainingSamples < 0 && feed.validation.outOfTraining) {
        emit(Warning{now(), "the checkpoint in " + options.resumeFrom +
                                " does not record how many samples it trained on (it was written before "
                                "validation data was held out): if that run trained on all of the data, "
                                "resume with --validation-split 0 so that the same samples follow"});
    }
}

void Trainer::Impl::checkResumedRun(const TrainerState& resumed) {
    const std::string checkpoint = "the checkpoint in " + options.resumeFrom;
    const std::string advice = ": resume with the settings of the run that wrote it, or start a new run";
    // Every sample once per epoch holds only on the same samples in the same order.
    if (const std::string current = feed.training->fingerprint();
        !resumed.dataFingerprint.empty() && !current.empty() && current != resumed.dataFingerprint) {
        throw badInput(checkpoint + " was written while training on other data (" +
                           cutForMessage(resumed.dataFingerprint) + "); this run's is " + current +
                           " (another data file or content, --data-seed, --validation-split or --validation-data)" +
                           advice,
                       "resume");
    }
    if (resumed.seed && *resumed.seed != options.seed) {
        throw badInput(checkpoint + " was written by a run with --seed " + std::to_string(*resumed.seed) +
                           ", but this run has --seed " + std::to_string(options.seed) +
                           ": the samples would come in another order, and this epoch would skip some and repeat "
                           "others" +
                           advice,
                       "resume");
    }
    if (!resumed.loss.empty() && resumed.loss != toString(options.loss)) {
        throw badInput(checkpoint + " was written training with the loss " + cutForMessage(resumed.loss) +
                           ", but this run uses " + toString(options.loss) + advice,
                       "resume");
    }
    // The optimizer goes on at the checkpoint's learning rate, with its state (the rate may have
    // been scaled with the target batch): another one is said, not dropped in silence.
    const double asked = options.optimizer.learningRate;
    if (std::abs(asked - resumed.learningRate) > 1e-9 * std::max(std::abs(asked), std::abs(resumed.learningRate))) {
        emit(Warning{now(), formatText("this run's learning rate %g (--lr, or the default) is not used: a resumed run "
                                       "goes on at its checkpoint's %g; start a new run to train at another",
                                       asked, resumed.learningRate)});
    }
}

}  // namespace batchpilot::core
