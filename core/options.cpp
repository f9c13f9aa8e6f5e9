#include "core/options.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace batchpilot::core {
namespace {

std::string lower(std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return text;
}

template <typename T>
std::string outOfRange(const char* field, T value, const std::string& range) {
    return std::string(field) + " is " + std::to_string(value) + ", but must be " + range;
}

}  // namespace

const char* toString(OptimizerKind kind) {
    switch (kind) {
    case OptimizerKind::Sgd: return "sgd";
    case OptimizerKind::Adam: return "adam";
    case OptimizerKind::AdamW: return "adamw";
    }
    return "unknown";
}

const char* toString(LrScaling rule) {
    switch (rule) {
    case LrScaling::None: return "none";
    case LrScaling::Linear: return "linear";
    case LrScaling::Sqrt: return "sqrt";
    }
    return "unknown";
}

const char* toString(NormKind kind) {
    switch (kind) {
    case NormKind::Group: return "group";
    case NormKind::Batch: return "batch";
    }
    return "unknown";
}

tl::expected<OptimizerKind, std::string> parseOptimizerKind(const std::string& text) {
    const std::string name = lower(text);
    if (name == "sgd") return OptimizerKind::Sgd;
    if (name == "adam") return OptimizerKind::Adam;
    if (name == "adamw") return OptimizerKind::AdamW;
    return tl::unexpected("unknown optimizer \"" + text + "\": choose sgd, adam or adamw");
}

tl::expected<LrScaling, std::string> parseLrScaling(const std::string& text) {
    const std::string name = lower(text);
    if (name == "none") return LrScaling::None;
    if (name == "linear") return LrScaling::Linear;
    if (name == "sqrt") return LrScaling::Sqrt;
    return tl::unexpected("unknown learning-rate scaling \"" + text +
                          "\": choose none, linear or sqrt");
}

tl::expected<NormKind, std::string> parseNormKind(const std::string& text) {
    const std::string name = lower(text);
    if (name == "group" || name == "groupnorm") return NormKind::Group;
    if (name == "batch" || name == "batchnorm") return NormKind::Batch;
    return tl::unexpected("unknown normalisation \"" + text + "\": choose group or batch");
}

const char* toString(LossKind kind) {
    switch (kind) {
    case LossKind::CrossEntropy: return "cross-entropy";
    case LossKind::Mse: return "mse";
    }
    return "unknown";
}

tl::expected<LossKind, std::string> parseLossKind(const std::string& text) {
    const std::string name = lower(text);
    if (name == "cross-entropy" || name == "crossentropy" || name == "ce") return LossKind::CrossEntropy;
    if (name == "mse") return LossKind::Mse;
    return tl::unexpected("unknown loss \"" + text + "\": choose cross-entropy (classification) or mse (regression)");
}

tl::expected<void, std::string> validate(const TrainerOptions& o) {
    // Upper limits keep every later size computation (samples × steps, bytes per sample) far from
    // overflow, and refuse before anything is allocated.
    if (o.targetBatch <= 0 || o.targetBatch > kMaxTargetBatch) {
        return tl::unexpected(outOfRange("target batch", o.targetBatch, "from 1 to " + std::to_string(kMaxTargetBatch) + " samples"));
    }
    if (o.steps < 0 || o.steps > kMaxSteps) return tl::unexpected(outOfRange("steps", o.steps, "from 0 to " + std::to_string(kMaxSteps)));
    if (o.epochs < 0 || o.epochs > kMaxEpochs) return tl::unexpected(outOfRange("epochs", o.epochs, "from 0 to " + std::to_string(kMaxEpochs)));
    if (o.intraOpThreads < 0 || o.intraOpThreads > kMaxThreads) {
        return tl::unexpected(outOfRange("threads", o.intraOpThreads, "from 0 (every CPU this process may use) to " + std::to_string(kMaxThreads)));
    }
    if (o.reservedCpus < 0 || o.reservedCpus > kMaxThreads) {
        return tl::unexpected(outOfRange("reserved CPUs", o.reservedCpus, "from 0 to " + std::to_string(kMaxThreads)));
    }
    if (!(o.cudaMemoryFraction >= 0.0 && o.cudaMemoryFraction <= 1.0)) {
        return tl::unexpected(outOfRange("CUDA memory fraction", o.cudaMemoryFraction, "between 0 (no cap) and 1"));
    }
    const ProbeOptions& p = o.probe;
    if (p.initialMicroBatch <= 0) {
        return tl::unexpected(outOfRange("initial micro-batch", p.initialMicroBatch, "at least 1"));
    }
    if (p.maxMicroBatch < 0) {
        return tl::unexpected(outOfRange("maximum micro-batch", p.maxMicroBatch, "0 (no limit) or more"));
    }
    if (p.multipleOf <= 0) {
        return tl::unexpected(outOfRange("round-to-multiple", p.multipleOf, "at least 1"));
    }
    if (!(p.headroom >= 0.0 && p.headroom <= 0.9)) {
        return tl::unexpected(outOfRange("headroom", p.headroom, "between 0 and 0.9 (a fraction)"));
    }
    if (p.maxTrials < 1) return tl::unexpected(outOfRange("maximum trials", p.maxTrials, "at least 1"));
    if (!(p.tolerance >= 0.0 && p.tolerance <= 0.5)) {
        return tl::unexpected(outOfRange("probe tolerance", p.tolerance, "between 0 and 0.5"));
    }
    const OptimizerOptions& opt = o.optimizer;
    if (!(opt.learningRate > 0.0 && opt.learningRate <= 1e6)) {
        return tl::unexpected(outOfRange("learning rate", opt.learningRate, "positive and at most 1e6"));
    }
    if (!(opt.momentum >= 0.0 && opt.momentum < 1.0)) {
        return tl::unexpected(outOfRange("momentum", opt.momentum, "in [0, 1)"));
    }
    if (!(opt.weightDecay >= 0.0)) {
        return tl::unexpected(outOfRange("weight decay", opt.weightDecay, "0 or more"));
    }
    if (!(opt.beta1 >= 0.0 && opt.beta1 < 1.0 && opt.beta2 >= 0.0 && opt.beta2 < 1.0)) {
        return tl::unexpected(std::string("Adam betas must be in [0, 1)"));
    }
    if (!o.datasetFactory) {
        const DataOptions& d = o.data;
        if (d.samples <= 0 || d.samples > kMaxSamples) {
            return tl::unexpected(outOfRange("dataset samples", d.samples, "from 1 to " + std::to_string(kMaxSamples)));
        }
        if (d.classes < 2 || d.classes > kMaxClasses) {
            return tl::unexpected(outOfRange("classes", d.classes, "from 2 to " + std::to_string(kMaxClasses)));
        }
        if (d.channels <= 0 || d.height <= 0 || d.width <= 0) {
            return tl::unexpected(std::string("image size must be positive in every dimension (e.g. 3x32x32)"));
        }
        if (d.channels > 4096 || d.height > 65536 || d.width > 65536 ||
            d.channels * d.height * d.width > kMaxSampleElements) {
            return tl::unexpected("image size " + std::to_string(d.channels) + "x" + std::to_string(d.height) + "x" +
                                  std::to_string(d.width) + " is too large: at most " +
                                  std::to_string(kMaxSampleElements) + " values per sample (e.g. 3x4096x4096), "
                                  "4096 channels and 65536 pixels a side");
        }
    }
    if (o.checkpoint.everySteps < 0) {
        return tl::unexpected(outOfRange("checkpoint interval", o.checkpoint.everySteps, "0 (only at the end) or more steps"));
    }
    if (o.checkpoint.everySteps > 0 && o.checkpoint.directory.empty()) {
        return tl::unexpected(std::string("a checkpoint interval needs a checkpoint directory"));
    }
    if (o.regrowAfterSteps < 0) {
        return tl::unexpected(outOfRange("regrow-after steps", o.regrowAfterSteps, "0 (never) or more"));
    }
    return {};
}

}  // namespace batchpilot::core
