#include "core/config/options.h"

#include "core/config/option_schema.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>

#include "core/config/device_spec.h"
#include "core/events/event_limits.h"
#include "core/events/events.h"

namespace batchpilot::core {

// What an event can claim is what the options allow: an events file's reader refuses the rest.
static_assert(kMaxEventSamples == kMaxTargetBatch && kMaxEventSteps == kMaxSteps && kMaxEventRanks == kMaxDevices &&
              kMaxEventTrials == kMaxProbeTrials);

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
    return tl::unexpected("unknown learning-rate scaling \"" + text + "\": choose none, linear or sqrt");
}

const char* toString(ProbeObjective objective) {
    switch (objective) {
    case ProbeObjective::Fastest: return "fastest";
    case ProbeObjective::Largest: return "largest";
    }
    return "unknown";
}

tl::expected<ProbeObjective, std::string> parseProbeObjective(const std::string& text) {
    const std::string name = lower(text);
    if (name == "fastest") return ProbeObjective::Fastest;
    if (name == "largest") return ProbeObjective::Largest;
    return tl::unexpected("unknown probe objective \"" + text + "\": choose fastest or largest");
}

const char* toString(MemorySavers savers) {
    switch (savers) {
    case MemorySavers::Off: return "off";
    case MemorySavers::Checkpoint: return "checkpoint";
    case MemorySavers::Bf16: return "bf16";
    case MemorySavers::Both: return "both";
    case MemorySavers::Fp16: return "fp16";
    case MemorySavers::CheckpointFp16: return "checkpoint-fp16";
    case MemorySavers::Auto: return "auto";
    }
    return "unknown";
}

tl::expected<MemorySavers, std::string> parseMemorySavers(const std::string& text) {
    const std::string name = lower(text);
    if (name == "off" || name == "none") return MemorySavers::Off;
    if (name == "checkpoint" || name == "checkpointing") return MemorySavers::Checkpoint;
    if (name == "bf16" || name == "bfloat16") return MemorySavers::Bf16;
    if (name == "both" || name == "checkpoint-bf16") return MemorySavers::Both;
    if (name == "fp16" || name == "float16" || name == "half") return MemorySavers::Fp16;
    if (name == "checkpoint-fp16") return MemorySavers::CheckpointFp16;
    if (name == "auto") return MemorySavers::Auto;
    return tl::unexpected("unknown memory savers \"" + text +
                          "\": choose auto, checkpoint, bf16, both, fp16, checkpoint-fp16 or off");
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

std::vector<std::string> builtinModelNames() {
    return {"mlp", "cnn", "resnet"};
}

bool isModelFile(const std::string& name) {
    const auto builtins = builtinModelNames();
    if (std::find(builtins.begin(), builtins.end(), name) != builtins.end()) return false;
    if (name.ends_with(".pt") || name.ends_with(".pth")) return true;
    std::error_code ec;
    return !name.empty() && std::filesystem::is_regular_file(name, ec);
}

std::vector<std::string> datasetNames() {
    return {"synthetic", "mnist", "image-folder", "csv"};
}

std::string choiceList(const std::vector<std::string>& names) {
    std::string text;
    for (size_t i = 0; i < names.size(); ++i) {
        if (i > 0) text += i + 1 == names.size() ? " or " : ", ";
        text += names[i];
    }
    return text;
}

void setEpochs(TrainerOptions& options, int64_t epochs, bool stepsGiven) {
    options.epochs = epochs;
    if (!stepsGiven) options.steps.reset();
}

tl::expected<void, OptionProblem> check(const TrainerOptions& o) {
    using Problem = tl::unexpected<OptionProblem>;
    const auto problem = [](const char* field, std::string message) {
        return Problem(OptionProblem{field, std::move(message)});
    };
    // Every option's own range, as the schema declares it (core/config/option_schema.cpp). Upper
    // limits keep every later size computation (samples × steps, bytes per sample) far from
    // overflow, and refuse before anything is allocated. Then the rules between options.
    if (auto ranges = checkRanges(o); !ranges) return tl::unexpected(ranges.error());
    if (o.reservedCpus < 0 || o.reservedCpus > kMaxThreads) {
        return problem("reserved_cpus",
                       outOfRange("reserved CPUs", o.reservedCpus, "from 0 to " + std::to_string(kMaxThreads)));
    }
    const ProbeOptions& p = o.probe;
    if (p.maxMicroBatch > 0 && p.maxMicroBatch < p.initialMicroBatch) {
        return problem("probe.max_micro_batch",
                       "maximum micro-batch " + std::to_string(p.maxMicroBatch) + " is below the initial micro-batch " +
                           std::to_string(p.initialMicroBatch) + ": raise the maximum or lower the initial size");
    }
    if (!o.datasetFactory) {
        const DataOptions& d = o.data;
        if (d.channels <= 0 || d.height <= 0 || d.width <= 0) {
            return problem("data.image_size", "image size must be positive in every dimension (e.g. 3x32x32)");
        }
        if (d.channels > kMaxChannels || d.height > kMaxImageSide || d.width > kMaxImageSide ||
            d.channels * d.height * d.width > kMaxSampleElements) {
            return problem("data.image_size", "image size " + std::to_string(d.channels) + "x" +
                                                  std::to_string(d.height) + "x" + std::to_string(d.width) +
                                                  " is too large: at most " + std::to_string(kMaxSampleElements) +
                                                  " values per sample (e.g. 3x4096x4096), " +
                                                  std::to_string(kMaxChannels) + " channels and " +
                                                  std::to_string(kMaxImageSide) + " pixels a side");
        }
    }
    if (const std::string& metric = o.checkpoint.keepBest; !metric.empty()) {
        const auto& names = validationMetricNames();
        if (std::find(names.begin(), names.end(), metric) == names.end()) {
            std::string known;
            for (const std::string& name : names) known += (known.empty() ? "" : ", ") + name;
            return problem("checkpoint.keep_best",
                           "unknown validation metric \"" + metric + "\" to keep the best model by: one of " + known);
        }
        // What validation measures follows the targets: class ids get accuracies (also when
        // trained with MSE on one-hot targets), a regression table (data.regression) MSE and MAE.
        const bool classIds = !o.data.regression;
        if (classIds && (metric == "val_mse" || metric == "val_mae")) {
            return problem("checkpoint.keep_best", metric +
                                                       " is measured for regression data only (a CSV trained with "
                                                       "--loss mse); with class ids keep the best model by "
                                                       "val_accuracy or val_loss");
        }
        if (!classIds && (metric == "val_accuracy" || metric == "val_top5_accuracy")) {
            return problem("checkpoint.keep_best", metric +
                                                       " is measured for class ids only; a regression keeps "
                                                       "its best model by val_loss, val_mse or val_mae");
        }
        if (o.validation.split && *o.validation.split == 0 && o.validation.path.empty()) {
            return problem("checkpoint.keep_best", "keeping the best model by " + metric +
                                                       " needs validation, but --validation-split is 0: hold out a "
                                                       "share of the data or give --validation-data");
        }
    }
    return {};
}

tl::expected<void, std::string> validate(const TrainerOptions& options) {
    if (auto ok = check(options); !ok) return tl::unexpected(ok.error().message);
    return {};
}

double defaultLearningRate(OptimizerKind kind) {
    return kind == OptimizerKind::Sgd ? 0.05 : 0.001;
}

bool isDefaultLearningRate(double rate) {
    for (const OptimizerKind kind : {OptimizerKind::Sgd, OptimizerKind::Adam, OptimizerKind::AdamW})
        if (rate == defaultLearningRate(kind)) return true;
    return false;
}

void settle(TrainerOptions& o) {
    // A CSV trained with MSE predicts the target column's values rather than classes.
    if (o.data.name == "csv" && o.loss == LossKind::Mse) o.data.regression = true;
}

tl::expected<TrainerOptions, OptionProblem> resolve(TrainerOptions o) {
    using Problem = tl::unexpected<OptionProblem>;
    if (!o.modelFactory) {
        const auto models = builtinModelNames();
        if (std::find(models.begin(), models.end(), o.model.name) == models.end()) {
            if (!isModelFile(o.model.name)) {
                return Problem(OptionProblem{"model.name", "unknown model \"" + o.model.name + "\": choose " +
                                                               choiceList(models) +
                                                               ", or give a TorchScript file (.pt or .pth)"});
            }
            std::error_code ec;
            if (!std::filesystem::is_regular_file(o.model.name, ec)) {
                return Problem(OptionProblem{
                    "model.name",
                    "model file " + o.model.name +
                        " does not exist: export one from Python (see docs/guide/own-model-and-data.md)"});
            }
        }
    }
    if (!o.datasetFactory) {
        const auto datasets = datasetNames();
        if (std::find(datasets.begin(), datasets.end(), o.data.name) == datasets.end()) {
            return Problem(
                OptionProblem{"data.name", "unknown dataset \"" + o.data.name + "\": choose " + choiceList(datasets)});
        }
        if (o.data.name != "synthetic") {
            const std::string what = o.data.name == "csv" ? "CSV file" : "folder";
            if (o.data.path.empty()) {
                return Problem(OptionProblem{
                    "data.path", "the " + o.data.name + " dataset needs a data path (the " + what + " to read)"});
            }
            std::error_code ec;
            if (!std::filesystem::exists(o.data.path, ec)) {
                return Problem(OptionProblem{
                    "data.path", "data path " + o.data.path + " does not exist: name the " + what + " to read"});
            }
        }
        if (!o.validation.path.empty()) {
            if (o.data.name == "synthetic") {
                return Problem(OptionProblem{"validation.path",
                                             "validation data " + o.validation.path +
                                                 " given for synthetic data, which holds out samples of its own: "
                                                 "leave the validation data out, or train on a data file"});
            }
            std::error_code ec;
            if (!std::filesystem::exists(o.validation.path, ec)) {
                return Problem(OptionProblem{"validation.path", "validation data " + o.validation.path +
                                                                    " does not exist: name a file or folder in "
                                                                    "the training data's format"});
            }
        }
    }
    settle(o);
    if (auto device = parseDeviceName(o.device); !device) {
        return Problem(OptionProblem{"device", device.error()});
    } else {
        o.device = device->name();
        // Not dropped in silence: the cap is the CUDA caching allocator's, which nothing else has.
        if (o.cudaMemoryFraction > 0 && device->kind != DeviceKind::Cuda) {
            return Problem(
                OptionProblem{"cuda_memory_fraction",
                              "a CUDA memory fraction caps a GPU's caching allocator, but the device is " + o.device +
                                  ": leave it out, or give a virtual device the budget you want (e.g. virtual:8GiB)"});
        }
    }
    if (auto ok = check(o); !ok) return tl::unexpected(ok.error());
    return o;
}

}  // namespace batchpilot::core
