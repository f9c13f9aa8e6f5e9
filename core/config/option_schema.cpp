#include "core/config/option_schema.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <iomanip>
#include <regex>
#include <type_traits>
#include <sstream>

#include "core/config/device_spec.h"
#include "core/config/memory_savers.h"
#include "core/config/run_config.h"

namespace batchpilot::core {
namespace {

using nlohmann::json;
using Options = TrainerOptions;
constexpr int64_t kNoMaximum = std::numeric_limits<int64_t>::max();

std::string number(double value) {
    std::ostringstream out;
    out << std::setprecision(10) << value;
    return out.str();
}

template <typename T>
std::string shown(const T& value) {
    std::ostringstream out;
    out << value;
    return out.str();
}

/// A Choice whose parser accepts aliases: the check is the parser, the value written its name.
template <typename Parse>
std::function<tl::expected<void, std::string>(const std::string&)> checkedBy(Parse parse) {
    return [parse](const std::string& text) -> tl::expected<void, std::string> {
        if (auto parsed = parse(text); !parsed) return tl::unexpected(parsed.error());
        return {};
    };
}

/// An option's key, flag, label and type: what every option has.
OptionSpec named(std::string key, std::string flag, std::string label, OptionType type, std::string valueName) {
    OptionSpec s;
    s.key = std::move(key);
    s.flag = std::move(flag);
    s.label = std::move(label);
    s.type = type;
    s.valueName = std::move(valueName);
    return s;
}

/// get and set of an option that is one member of the options: `field` names it once (a generic
/// lambda, `[](auto& o) -> auto& { return o.model.width; }`, for const and non-const options
/// alike), and the value read is converted to the member's type.
template <typename Value, typename Field>
void bind(OptionSpec& s, Field field) {
    s.get = [field](const Options& o) { return json(field(o)); };
    s.set = [field](Options& o, const json& v, OptionReading&) {
        auto& member = field(o);
        member = static_cast<std::remove_reference_t<decltype(member)>>(v.get<Value>());
    };
}

/// The same for a member that may be unset (a std::optional): null unsets it.
template <typename Value, typename Field>
void bindOptional(OptionSpec& s, Field field) {
    s.get = [field](const Options& o) { return field(o) ? json(*field(o)) : json(nullptr); };
    s.set = [field](Options& o, const json& v, OptionReading&) {
        if (v.is_null())
            field(o).reset();
        else
            field(o) = v.get<Value>();
    };
}

template <typename Field>
OptionSpec integer(std::string key, std::string flag, std::string label, int64_t minimum, int64_t maximum,
                   Field field) {
    OptionSpec s = named(std::move(key), std::move(flag), std::move(label), OptionType::Integer, "N");
    s.minimum = minimum;
    s.maximum = maximum;
    if constexpr (std::is_same_v<decltype(field(std::declval<Options&>())), std::optional<int64_t>&>)
        bindOptional<int64_t>(s, field);
    else
        bind<int64_t>(s, field);
    return s;
}

template <typename Field>
OptionSpec real(std::string key, std::string flag, std::string label, double low, double high, Field field) {
    OptionSpec s = named(std::move(key), std::move(flag), std::move(label), OptionType::Number, "F");
    s.low = low;
    s.high = high;
    if constexpr (std::is_same_v<decltype(field(std::declval<Options&>())), std::optional<double>&>)
        bindOptional<double>(s, field);
    else
        bind<double>(s, field);
    return s;
}

template <typename Field>
OptionSpec text(std::string key, std::string flag, std::string label, Field field) {
    OptionSpec s = named(std::move(key), std::move(flag), std::move(label), OptionType::Text, "NAME");
    bind<std::string>(s, field);
    return s;
}

/// A Choice read by `parse` (which accepts aliases) and written by toString(); `field` is a generic
/// lambda naming the member, for const and non-const options alike.
template <typename Parse, typename Field>
OptionSpec choice(std::string key, std::string flag, std::string label, std::vector<std::string> choices, Parse parse,
                  Field field) {
    OptionSpec s = named(std::move(key), std::move(flag), std::move(label), OptionType::Choice, "NAME");
    s.choices = std::move(choices);
    s.checkText = checkedBy(parse);
    s.get = [field](const Options& o) { return json(toString(field(o))); };
    s.set = [parse, field](Options& o, const json& v, OptionReading&) { field(o) = *parse(v.get<std::string>()); };
    return s;
}

std::vector<OptionSpec> declare() {
    const Options d;  // the defaults, for the help texts
    std::vector<OptionSpec> all;
    std::string group;
    const auto add = [&](OptionSpec spec, std::string valueName, std::string help, std::string reference = {}) {
        spec.group = group;
        if (!valueName.empty()) spec.valueName = std::move(valueName);
        spec.help = std::move(help);
        spec.reference = std::move(reference);
        all.push_back(std::move(spec));
        return &all.back();
    };

    group = "Model and data";
    add(text(
            "model.name", "--model", "model", [](auto& o) -> auto& { return o.model.name; }),
        "NAME",
        "mlp, cnn or resnet (default " + d.model.name +
            "), or a TorchScript file (.pt/.pth)\n"
            "exported from Python: see docs/guide/own-model-and-data.md",
        "`mlp`, `cnn`, `resnet`, or a TorchScript file (`.pt`/`.pth`, or any existing file)");
    add(choice(
            "model.norm", "--norm", "normalisation", {"group", "batch"}, parseNormKind,
            [](auto& o) -> auto& { return o.model.norm; }),
        "KIND", "resnet normalisation: group (exact under accumulation) or batch\n(default group)");
    add(integer(
            "model.width", "--width", "model width", kMinModelWidth, kMaxModelWidth,
            [](auto& o) -> auto& { return o.model.width; }),
        "N", "channels of the first stage / hidden-unit scale (default " + shown(d.model.width) + ")");
    {
        OptionSpec data = text(
            "data.name", "--data", "dataset", [](auto& o) -> auto& { return o.data.name; });
        data.type = OptionType::Choice;
        data.choices = datasetNames();
        data.checkText = [](const std::string& v) -> tl::expected<void, std::string> {
            const auto names = datasetNames();
            if (std::find(names.begin(), names.end(), v) != names.end()) return {};
            return tl::unexpected("unknown dataset \"" + v + "\": choose " + choiceList(names));
        };
        add(std::move(data), "NAME",
            "synthetic (default): learnable generated images; mnist (IDX files),\n"
            "image-folder (one subfolder per class) or csv (a table)");
    }
    add(text(
            "data.path", "--data-path", "data path", [](auto& o) -> auto& { return o.data.path; }),
        "PATH", "the MNIST folder, image folder or CSV file to read");
    add(text(
            "data.target_column", "--target-column", "target column",
            [](auto& o) -> auto& { return o.data.targetColumn; }),
        "NAME", "csv: the column to predict (the others are numeric features)");
    {
        OptionSpec regression = named("data.regression", "", "regression", OptionType::Boolean, "");
        bind<bool>(
            regression, [](auto& o) -> auto& { return o.data.regression; });
        add(std::move(regression), "", "",
            "the CSV's targets are float values (set by `core::resolve` for a CSV trained with `\"loss\": \"mse\"`)");
    }
    {
        OptionSpec size = named("data.image_size", "--image-size", "image size", OptionType::ImageSize, "CxHxW");
        size.get = [](const Options& o) { return json{o.data.channels, o.data.height, o.data.width}; };
        size.set = [](Options& o, const json& v, OptionReading&) {
            o.data.channels = v[0].get<int64_t>();
            o.data.height = v[1].get<int64_t>();
            o.data.width = v[2].get<int64_t>();
        };
        add(std::move(size), "CxHxW",
            "sample shape (default 3x32x32; 3x224x224 works); image-folder\n"
            "resizes to it (C: 3 for RGB, 1 for grey)",
            "channels 1 to " + shown(kMaxChannels) + ", sides 1 to " + shown(kMaxImageSide) + ", at most " +
                shown(kMaxSampleElements) + " values per sample (e.g. 3x4096x4096)");
    }
    add(integer(
            "data.classes", "--classes", "classes", 2, kMaxClasses, [](auto& o) -> auto& { return o.data.classes; }),
        "N", "number of classes (default " + shown(d.data.classes) + ")", "number of classes (synthetic data)");
    add(integer(
            "data.samples", "--samples", "dataset samples", 1, kMaxSamples,
            [](auto& o) -> auto& { return o.data.samples; }),
        "N", "dataset size (default " + shown(d.data.samples) + ")", "dataset size (synthetic data)");
    add(integer(
            "data.seed", "--data-seed", "data seed", 0, kNoMaximum, [](auto& o) -> auto& { return o.data.seed; }),
        "N", "seed of the generated data (default " + shown(d.data.seed) + ")",
        "seed of the generated data and of the validation split");

    group = "Device and batch";
    {
        auto device = text(
            "device", "--device", "device", [](auto& o) -> auto& { return o.device; });
        // Stored by its canonical name ("virtual:512MiB").
        device.set = [](Options& o, const json& v, OptionReading&) {
            o.device = parseDeviceName(v.get<std::string>())->name();
        };
        device.checkText = checkedBy(parseDeviceName);
        add(std::move(device), "DEV",
            "cpu, cuda:N or virtual:<size> — a simulated GPU with a memory budget\n"
            "and PyTorch's caching allocator, e.g. virtual:512MiB or virtual:T4;\n"
            "its settings after a slash: virtual:8GiB/expandable_segments:True,\n"
            "or virtual:8GiB/exact to count bytes exactly (docs/guide/virtual-gpu.md)\n"
            "(default " +
                d.device + ")",
            "`cpu`, `cuda:N` or `virtual:<size>` (a simulated GPU; see docs/guide/virtual-gpu.md)");
    }
    {
        OptionSpec equal = named("equal_shares", "--equal-shares", "equal shares", OptionType::Boolean, "");
        equal.get = [](const Options& o) { return json(!o.balanceShares); };
        equal.set = [](Options& o, const json& v, OptionReading&) { o.balanceShares = !v.get<bool>(); };
        add(std::move(equal), "",
            "several devices: every rank trains an equal share of each batch,\n"
            "whatever its memory and speed (as DDP-style tools do), for comparison");
    }
    add(integer(
            "check_ranks_every", "--check-ranks-every", "rank check interval", 0, kMaxSteps,
            [](auto& o) -> auto& { return o.parameterCheckEvery; }),
        "N",
        "several devices: steps between checks that every rank holds the same\n"
        "parameters (default " +
            shown(d.parameterCheckEvery) + "; 0: only at the end)");
    add(integer(
            "target_batch", "--target-batch", "target batch", 1, kMaxTargetBatch,
            [](auto& o) -> auto& { return o.targetBatch; }),
        "N", "samples per optimizer step (default " + shown(d.targetBatch) + ")");
    add(integer(
            "probe.initial_micro_batch", "--initial-micro-batch", "initial micro-batch", 1, kMaxTargetBatch,
            [](auto& o) -> auto& { return o.probe.initialMicroBatch; }),
        "N", "first probe trial (default " + shown(d.probe.initialMicroBatch) + ")");
    add(integer(
            "probe.max_micro_batch", "--max-micro-batch", "maximum micro-batch", 0, kMaxTargetBatch,
            [](auto& o) -> auto& { return o.probe.maxMicroBatch; }),
        "N", "upper limit for the micro-batch (default 0: none)",
        "upper limit for the micro-batch, not below the initial size; 0: none");
    add(real(
            "probe.headroom", "--headroom", "headroom", 0.0, 0.9, [](auto& o) -> auto& { return o.probe.headroom; }),
        "F", "fraction of device memory kept free, 0..0.9 (default " + shown(d.probe.headroom) + ")");
    add(real(
            "probe.tolerance", "", "probe tolerance", 0.0, 0.5, [](auto& o) -> auto& { return o.probe.tolerance; }),
        "", "", "the probe stops when its bracket is this close (a fraction), or adjacent");
    add(choice(
            "probe.objective", "--objective", "probe objective", {"fastest", "largest"}, parseProbeObjective,
            [](auto& o) -> auto& { return o.probe.objective; }),
        "GOAL",
        "after finding the largest micro-batch that fits: fastest (default)\n"
        "times smaller sizes on real training micro-batches and keeps the one\n"
        "with the most samples/s; largest keeps the largest");
    add(integer(
            "probe.retime_every", "--retime-every", "re-timing interval", 0, kMaxRetimeEvery,
            [](auto& o) -> auto& { return o.probe.retimeEvery; }),
        "N",
        "fastest: every N steps compare the throughput with the one after the\n"
        "decision and time the sizes again when it drifted (default 0: never)");
    add(real(
            "probe.retime_drift", "--retime-drift", "throughput drift", 0.01, 10.0,
            [](auto& o) -> auto& { return o.probe.retimeDrift; }),
        "F", "the drift that --retime-every acts on, a fraction (default " + shown(d.probe.retimeDrift) + ")");
    add(real(
            "probe.check_seconds", "--check-seconds", "check seconds", 0.0, 3600.0,
            [](auto& o) -> auto& { return o.probe.checkSeconds; }),
        "S",
        "fastest: before a size below the largest is kept, time whole training\n"
        "batches of the two in turns until their ratio, the gain claimed, is\n"
        "known to 2%, for at most about S seconds (default " +
            shown(d.probe.checkSeconds) + "; 0: not checked)");
    add(integer(
            "probe.multiple_of", "--multiple-of", "round-to-multiple", 1, kMaxTargetBatch,
            [](auto& o) -> auto& { return o.probe.multipleOf; }),
        "N", "round the micro-batch down to a multiple of N (default " + shown(d.probe.multipleOf) + ")");
    add(integer(
            "probe.max_trials", "--max-trials", "maximum trials", 1, kMaxProbeTrials,
            [](auto& o) -> auto& { return o.probe.maxTrials; }),
        "N", "probe trial limit (default " + shown(d.probe.maxTrials) + ")");
    add(integer(
            "regrow_after_steps", "--regrow-after", "regrow-after steps", 0, kMaxRegrowAfterSteps,
            [](auto& o) -> auto& { return o.regrowAfterSteps; }),
        "N",
        "clean steps after an OOM before trying a larger micro-batch\n"
        "(default " +
            shown(d.regrowAfterSteps) + ", 0 = never)");
    add(real(
            "cuda_memory_fraction", "--cuda-memory-fraction", "CUDA memory fraction", 0.0, 1.0,
            [](auto& o) -> auto& { return o.cudaMemoryFraction; }),
        "F",
        "cuda:N only: let this process use at most F (0..1] of the GPU's\n"
        "memory, so that a large GPU runs out of memory like a small one\n"
        "(default 0: no cap)");

    group = "Optimisation";
    add(choice(
            "optimizer.kind", "--optimizer", "optimizer", {"sgd", "adam", "adamw"}, parseOptimizerKind,
            [](auto& o) -> auto& { return o.optimizer.kind; }),
        "NAME", "sgd (with momentum), adam or adamw (default sgd)");
    {
        auto lr = real(
            "optimizer.learning_rate", "--lr", "learning rate", 0.0, kMaxLearningRate,
            [](auto& o) -> auto& { return o.optimizer.learningRate; });
        lr.lowOpen = true;
        add(std::move(lr), "F",
            "learning rate (default " + shown(defaultLearningRate(OptimizerKind::Sgd)) + " for sgd, " +
                shown(defaultLearningRate(OptimizerKind::Adam)) + " for adam and adamw:\nPyTorch's)",
            "learning rate; when none is given, the optimizer's own: " +
                shown(defaultLearningRate(OptimizerKind::Sgd)) + " for sgd, " +
                shown(defaultLearningRate(OptimizerKind::Adam)) + " for adam and adamw (PyTorch's)");
    }
    {
        auto momentum = real(
            "optimizer.momentum", "--momentum", "momentum", 0.0, 1.0,
            [](auto& o) -> auto& { return o.optimizer.momentum; });
        momentum.highOpen = true;
        add(std::move(momentum), "F", "SGD momentum (default " + shown(d.optimizer.momentum) + ")");
    }
    add(real(
            "optimizer.weight_decay", "--weight-decay", "weight decay", 0.0, kMaxWeightDecay,
            [](auto& o) -> auto& { return o.optimizer.weightDecay; }),
        "F", "L2 (sgd, adam) or decoupled (adamw) weight decay (default 0)");
    for (const auto& [key, label, field] : {std::tuple{"optimizer.beta1", "Adam beta1", &OptimizerOptions::beta1},
                                            std::tuple{"optimizer.beta2", "Adam beta2", &OptimizerOptions::beta2}}) {
        const auto member = field;
        auto beta = real(
            key, "", label, 0.0, 1.0, [member](auto& o) -> auto& { return o.optimizer.*member; });
        beta.highOpen = true;
        add(std::move(beta), "", "", "Adam and AdamW's moment decay");
    }
    add(real(
            "optimizer.epsilon", "", "epsilon", 0.0, 1.0, [](auto& o) -> auto& { return o.optimizer.epsilon; }),
        "", "", "Adam and AdamW's epsilon");
    add(choice(
            "lr_scaling", "--lr-scaling", "learning-rate scaling", {"none", "linear", "sqrt"}, parseLrScaling,
            [](auto& o) -> auto& { return o.lrScaling; }),
        "RULE",
        "how the learning rate follows a change of the target batch during a\n"
        "run: none (default), linear or sqrt");
    add(choice(
            "loss", "--loss", "loss", {"cross-entropy", "mse"}, parseLossKind, [](auto& o) -> auto& { return o.loss; }),
        "NAME",
        "cross-entropy (classification, default) or mse (regression; with\n"
        "csv the target column holds the values to predict)");
    add(choice(
            "memory_savers", "--memory-savers", "memory savers",
            {"off", "checkpoint", "bf16", "both", "fp16", "checkpoint-fp16", "auto"}, parseMemorySavers,
            [](auto& o) -> auto& { return o.memorySavers; }),
        "SAVERS",
        "trade speed or precision for memory: checkpoint (recompute activations\n"
        "in backward), bf16 (bfloat16 autocast), both, fp16 (float16 autocast with\n"
        "loss scaling, for GPUs without fast bfloat16), checkpoint-fp16, auto\n"
        "(measure them when the micro-batch is small or nothing fits, and use the\n"
        "fastest) or off (default)");
    add(integer(
            "saver_threshold", "--saver-threshold", "saver threshold", 0, kMaxTargetBatch,
            [](auto& o) -> auto& { return o.saverThreshold; }),
        "N",
        "measure every memory saver when the probe finds a micro-batch below N\n"
        "(and below the target batch), and suggest the fastest (default " +
            shown(d.saverThreshold) + "; 0: only when nothing fits)");
    add(real(
            "loss_scale", "--loss-scale", "loss scale", 1.0, kMaxLossScale,
            [](auto& o) -> auto& { return o.lossScale; }),
        "S",
        "fp16 memory savers: the loss scale to start from (default " + shown(d.lossScale) +
            "); halved\nwhen gradients overflow float16 (the batch is trained again), doubled after\n" +
            shown(kLossScaleGrowthSteps) + " steps without");
    {
        auto steps = integer(
            "steps", "--steps", "steps", 1, kMaxSteps, [](auto& o) -> auto& { return o.steps; });
        steps.nullMeans = "no step limit";
        steps.zeroIsAbsent = true;
        steps.set = [](Options& o, const json& v, OptionReading& reading) {
            if (v.is_null()) {
                o.steps.reset();
            } else {
                o.steps = v.get<int64_t>();
                reading.stepsGiven = true;
            }
        };
        add(std::move(steps), "N",
            "optimizer steps to run (default " + shown(kDefaultSteps) + " unless --epochs is given)",
            "optimizer steps to run; `epochs` without `steps` drops this default");
    }
    {
        auto epochs = integer(
            "epochs", "--epochs", "epochs", 1, kMaxEpochs, [](auto& o) -> auto& { return o.epochs; });
        epochs.nullMeans = "no epoch limit";
        epochs.zeroIsAbsent = true;
        epochs.set = [](Options& o, const json& v, OptionReading& reading) {
            if (v.is_null()) {
                o.epochs.reset();
                reading.epochs.reset();
            } else {
                reading.epochs = v.get<int64_t>();
            }
        };
        add(std::move(epochs), "N", "passes over the data (with --steps too, whichever ends first)");
    }
    add(integer(
            "seed", "--seed", "seed", 0, kNoMaximum, [](auto& o) -> auto& { return o.seed; }),
        "N", "model initialisation and sample order (default " + shown(d.seed) + ")");
    add(integer(
            "threads", "--threads", "threads", 0, kMaxThreads, [](auto& o) -> auto& { return o.intraOpThreads; }),
        "N",
        "CPU threads for LibTorch, at most " + shown(kMaxThreads) +
            " (default 0: OMP_NUM_THREADS if set, else every CPU)");

    group = "Validation";
    {
        auto split = real(
            "validation.split", "--validation-split", "validation split", 0.0, 0.9,
            [](auto& o) -> auto& { return o.validation.split; });
        split.nullMeans = "the default, " + shown(kDefaultValidationSplit);
        add(std::move(split), "F",
            "share of the data held out for validation, 0..0.9, drawn from the data\n"
            "seed (default 0.1; synthetic data gets that share of extra samples of\n"
            "its own); 0: no validation");
    }
    add(text(
            "validation.path", "--validation-data", "validation data",
            [](auto& o) -> auto& { return o.validation.path; }),
        "PATH",
        "evaluate this file or folder instead of a held-out share (the training\n"
        "data's format, e.g. MNIST's t10k-images-idx3-ubyte)");
    {
        auto every = integer(
            "validation.every_steps", "--validate-every", "validation interval", 1, kMaxSteps,
            [](auto& o) -> auto& { return o.validation.everySteps; });
        every.nullMeans = "at the end of every epoch";
        add(std::move(every), "N", "validate every N optimizer steps (default: at the end of each epoch)");
    }

    group = "Checkpoints";
    add(text(
            "checkpoint.directory", "--checkpoint-dir", "checkpoint folder",
            [](auto& o) -> auto& { return o.checkpoint.directory; }),
        "DIR",
        "save model, optimizer and trainer state to DIR/checkpoint.pt when the run\n"
        "ends or is stopped (written atomically: a crash never corrupts it)");
    add(integer(
            "checkpoint.every_steps", "--checkpoint-every", "checkpoint interval", 0, kMaxSteps,
            [](auto& o) -> auto& { return o.checkpoint.everySteps; }),
        "N",
        "also every N optimizer steps (without --checkpoint-dir: in the run\n"
        "folder's checkpoint/; 0: only when the run ends or stops)");
    add(text(
            "checkpoint.keep_best", "--keep-best", "best-model metric",
            [](auto& o) -> auto& { return o.checkpoint.keepBest; }),
        "METRIC",
        "also keep the model that scored best so far on this validation metric\n"
        "in CHECKPOINT_DIR/best (val_loss, val_accuracy, val_top5_accuracy,\n"
        "val_mse, val_mae; without --checkpoint-dir: in the run folder's\n"
        "checkpoint/best); resume from it or load its model like any checkpoint",
        "`\"\"` (only the latest) or a validation metric: `val_loss`, `val_accuracy`, `val_top5_accuracy`, "
        "`val_mse`, `val_mae`");
    return all;
}

std::string brief(const json& value) {
    std::string written = jsonText(value);
    return written.size() > 40 ? written.substr(0, 37) + "..." : written;
}

/// "expected an integer from 1 to 1000" / "from 0 up".
std::string integerExpectation(int64_t minimum, int64_t maximum) {
    return "expected an integer from " + std::to_string(minimum) +
           (maximum == kNoMaximum ? " up" : " to " + std::to_string(maximum));
}

tl::expected<int64_t, std::string> readInteger(const json& v, int64_t minimum, int64_t maximum) {
    if (!v.is_number_integer() && !v.is_number_unsigned())
        return tl::unexpected(std::string("expected an integer, got ") + jsonTypeName(v) + " " + brief(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kNoMaximum))
        return tl::unexpected(integerExpectation(minimum, maximum) + ", got " + std::to_string(v.get<uint64_t>()));
    const auto n = v.get<int64_t>();
    if (n < minimum || n > maximum)
        return tl::unexpected(integerExpectation(minimum, maximum) + ", got " + std::to_string(n));
    return n;
}

bool numberInRange(const OptionSpec& s, double x) {
    return std::isfinite(x) && (s.lowOpen ? x > s.low : x >= s.low) && (s.highOpen ? x < s.high : x <= s.high);
}

/// An Integer or Number option's value checked against its type and range; the message without
/// the option's name.
tl::expected<json, std::string> checkedNumber(const OptionSpec& s, const json& value) {
    if (s.type == OptionType::Integer) {
        auto n = readInteger(value, s.minimum, s.maximum);
        if (!n) return tl::unexpected(n.error());
        return json(*n);
    }
    if (!value.is_number())
        return tl::unexpected(std::string("expected a number, got ") + jsonTypeName(value) + " " + brief(value));
    const auto x = value.get<double>();
    if (!numberInRange(s, x)) {
        std::ostringstream range;
        range << "expected a number in " << (s.lowOpen ? "(" : "[") << s.low << ", " << s.high
              << (s.highOpen ? ")" : "]") << ", got " << x;
        return tl::unexpected(range.str());
    }
    return json(x);
}

}  // namespace

const std::vector<OptionSpec>& optionSchema() {
    static const std::vector<OptionSpec> schema = declare();
    return schema;
}

const OptionSpec* findOption(const std::string& key) {
    for (const OptionSpec& spec : optionSchema())
        if (spec.key == key) return &spec;
    return nullptr;
}

const OptionSpec* findFlag(const std::string& flag) {
    for (const OptionSpec& spec : optionSchema())
        if (!spec.flag.empty() && spec.flag == flag) return &spec;
    return nullptr;
}

json optionDefault(const OptionSpec& spec) {
    return spec.get(TrainerOptions{});
}

std::string rangeText(const OptionSpec& s) {
    if (s.type == OptionType::Integer) {
        return s.maximum == kNoMaximum ? "at least " + std::to_string(s.minimum)
                                       : "from " + std::to_string(s.minimum) + " to " + std::to_string(s.maximum);
    }
    if (s.lowOpen) return "above " + number(s.low) + " and at most " + number(s.high);
    if (s.highOpen) return "at least " + number(s.low) + " and below " + number(s.high);
    return "from " + number(s.low) + " to " + number(s.high);
}

tl::expected<void, std::string> readOption(const OptionSpec& s, const json& value, const std::string& where,
                                           TrainerOptions& options, OptionReading& reading) {
    const auto fail = [&](const std::string& what) { return tl::unexpected(where + ": " + what); };
    if (s.key == "optimizer.kind") reading.optimizerGiven = true;
    if (s.key == "optimizer.learning_rate") reading.learningRateGiven = true;
    if (value.is_null()) {
        if (s.nullMeans.empty())
            return fail(std::string("expected ") + [&] {
                switch (s.type) {
                case OptionType::Integer: return "an integer";
                case OptionType::Number: return "a number";
                case OptionType::Boolean: return "true or false";
                case OptionType::ImageSize: return "[channels, height, width]";
                default: return "a string";
                }
            }() + ", got null");
        s.set(options, value, reading);
        return {};
    }
    switch (s.type) {
    case OptionType::Integer:
    case OptionType::Number: {
        if (s.zeroIsAbsent && value.is_number_integer() && value.get<int64_t>() == 0) return {};
        auto checked = checkedNumber(s, value);
        if (!checked) return fail(checked.error());
        s.set(options, *checked, reading);
        return {};
    }
    case OptionType::Boolean:
        if (!value.is_boolean())
            return fail(std::string("expected true or false, got ") + jsonTypeName(value) + " " + brief(value));
        s.set(options, value, reading);
        return {};
    case OptionType::ImageSize: {
        if (!value.is_array() || value.size() != 3)
            return fail("expected [channels, height, width], e.g. [3, 32, 32], got " + brief(value));
        const std::array<int64_t, 3> limits{kMaxChannels, kMaxImageSide, kMaxImageSide};
        json parts = json::array();
        for (size_t i = 0; i < 3; ++i) {
            auto n = readInteger(value[i], 1, limits[i]);
            if (!n) return tl::unexpected(where + "[" + std::to_string(i) + "]: " + n.error());
            parts.push_back(*n);
        }
        s.set(options, parts, reading);
        return {};
    }
    case OptionType::Text:
    case OptionType::Choice:
        if (!value.is_string())
            return fail(std::string("expected a string, got ") + jsonTypeName(value) + " " + brief(value));
        if (s.type == OptionType::Choice) {
            // One spelling of each name, in every front end: a configuration, a command or a flag
            // that says "FP16" is refused as one that says "fp17" would be, not read as fp16.
            const auto& text = value.get_ref<const std::string&>();
            if (std::any_of(text.begin(), text.end(), [](char c) { return c >= 'A' && c <= 'Z'; })) {
                std::string lower = text;
                for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
                return fail("\"" + text + "\": names are written in lower case (\"" + lower + "\")");
            }
        }
        if (s.checkText) {
            if (auto ok = s.checkText(value.get<std::string>()); !ok) return fail(ok.error());
        }
        s.set(options, value, reading);
        return {};
    }
    return fail("unknown option type");
}

tl::expected<void, std::string> checkOptionNumber(const OptionSpec& spec, const json& value, const std::string& where) {
    if (spec.type != OptionType::Integer && spec.type != OptionType::Number)
        return tl::unexpected(where + ": " + spec.key + " is not a number option");
    if (auto checked = checkedNumber(spec, value); !checked) return tl::unexpected(where + ": " + checked.error());
    return {};
}

tl::expected<void, std::string> checkInteger(int64_t value, int64_t minimum, int64_t maximum,
                                             const std::string& where) {
    if (auto n = readInteger(json(value), minimum, maximum); !n) return tl::unexpected(where + ": " + n.error());
    return {};
}

void finishReading(TrainerOptions& options, const OptionReading& reading) {
    if (reading.epochs) setEpochs(options, *reading.epochs, reading.stepsGiven);
    // An optimizer named without a learning rate gets its own default, unless the rate in place
    // was chosen (by a configuration under these flags: --config adam.json --optimizer adamw).
    if (reading.optimizerGiven && !reading.learningRateGiven && isDefaultLearningRate(options.optimizer.learningRate))
        options.optimizer.learningRate = defaultLearningRate(options.optimizer.kind);
}

tl::expected<json, std::string> optionValueFromText(const OptionSpec& s, const std::string& given) {
    switch (s.type) {
    case OptionType::Integer: {
        // In decimal, as written: CLI11 would read a leading 0 as octal ("010" as 8). Zeros are
        // dropped only from a number ("0-0" stays what it is: not a number).
        std::string digits = given;
        const size_t sign = !digits.empty() && digits[0] == '-' ? 1 : 0;
        const bool allDigits =
            digits.size() > sign && std::all_of(digits.begin() + static_cast<std::ptrdiff_t>(sign), digits.end(),
                                                [](char c) { return c >= '0' && c <= '9'; });
        if (!allDigits) return tl::unexpected("expects a whole number, got \"" + given + "\"");
        size_t zeros = sign;
        while (zeros + 1 < digits.size() && digits[zeros] == '0') ++zeros;
        digits.erase(sign, zeros - sign);
        int64_t value = 0;
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        const std::string range = rangeText(s);
        if (ec == std::errc::result_out_of_range)
            return tl::unexpected("expects a whole number " + range + ", got " + given);
        if (ec != std::errc{} || end != digits.data() + digits.size())
            return tl::unexpected("expects a whole number, got \"" + given + "\"");
        if (value < s.minimum || value > s.maximum) return tl::unexpected("must be " + range + ", got " + given);
        return json(value);
    }
    case OptionType::Number: {
        double value = 0;
        try {
            size_t used = 0;
            value = std::stod(given, &used);
            if (used != given.size()) return tl::unexpected("expects a number, got \"" + given + "\"");
        } catch (const std::exception&) {
            return tl::unexpected("expects a number, got \"" + given + "\"");
        }
        if (!std::isfinite(value)) return tl::unexpected("expects a finite number, got \"" + given + "\"");
        if (!numberInRange(s, value)) return tl::unexpected("must be " + rangeText(s) + ", got " + given);
        return json(value);
    }
    case OptionType::ImageSize: {
        std::array<int64_t, 3> parts{};
        const char* at = given.data();
        const char* last = given.data() + given.size();
        for (size_t i = 0; i < parts.size(); ++i) {
            const auto [end, ec] = std::from_chars(at, last, parts[i]);
            const bool separated = i + 1 < parts.size() ? end != last && *end == 'x' : end == last;
            if (ec != std::errc{} || !separated || parts[i] < 1)
                return tl::unexpected("expects CxHxW such as 3x32x32, got \"" + given + "\"");
            at = end + 1;
        }
        // Priced before anything is allocated: the same limits as check()'s.
        if (parts[0] > kMaxChannels || parts[1] > kMaxImageSide || parts[2] > kMaxImageSide ||
            parts[0] * parts[1] * parts[2] > kMaxSampleElements) {
            return tl::unexpected("image size " + given + " is too large: at most " + shown(kMaxSampleElements) +
                                  " values per sample (e.g. 3x4096x4096), " + shown(kMaxChannels) + " channels and " +
                                  shown(kMaxImageSide) + " pixels a side");
        }
        return json{parts[0], parts[1], parts[2]};
    }
    case OptionType::Boolean:
        if (given == "true") return json(true);
        if (given == "false") return json(false);
        return tl::unexpected("expects true or false, got \"" + given + "\"");
    case OptionType::Text:
    case OptionType::Choice:
        if (given.empty())
            return tl::unexpected(std::string("is empty: give a value, or leave the flag out for the default"));
        if (s.checkText) {
            if (auto ok = s.checkText(given); !ok) return tl::unexpected(ok.error());
        }
        return json(given);
    }
    return tl::unexpected(std::string("unknown option type"));
}

tl::expected<void, OptionProblem> checkRanges(const TrainerOptions& options) {
    for (const OptionSpec& s : optionSchema()) {
        if (s.type != OptionType::Integer && s.type != OptionType::Number) continue;
        // Data from a factory (tests, user code) is not described by these options.
        if (options.datasetFactory && s.key.starts_with("data.")) continue;
        const json value = s.get(options);
        if (value.is_null()) continue;
        bool inside = false;
        std::string shownValue;
        if (s.type == OptionType::Integer) {
            const auto n = value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(kNoMaximum)
                               ? std::optional<int64_t>()
                               : std::optional<int64_t>(value.get<int64_t>());
            inside = n && *n >= s.minimum && *n <= s.maximum;
            shownValue = jsonText(value);
        } else {
            inside = numberInRange(s, value.get<double>());
            shownValue = number(value.get<double>());
        }
        if (!inside) {
            std::string range = rangeText(s);
            if (!s.nullMeans.empty()) range += " (or none: " + s.nullMeans + ")";
            return tl::unexpected(OptionProblem{s.key, s.label + " is " + shownValue + ", but must be " + range});
        }
    }
    return {};
}

namespace {

std::string referenceRange(const OptionSpec& s) {
    std::string cell;
    switch (s.type) {
    case OptionType::Integer: cell = "integer, " + rangeText(s); break;
    case OptionType::Number: cell = "number, " + rangeText(s); break;
    case OptionType::Text: cell = "string"; break;
    case OptionType::Boolean: cell = "`true` or `false`"; break;
    case OptionType::ImageSize: cell = "`[channels, height, width]`"; break;
    case OptionType::Choice:
        for (size_t i = 0; i < s.choices.size(); ++i) {
            if (i > 0) cell += i + 1 == s.choices.size() ? " or " : ", ";
            cell += "`\"" + s.choices[i] + "\"`";
        }
        break;
    }
    if (!s.nullMeans.empty()) cell += ", or `null`: " + s.nullMeans;
    if (s.zeroIsAbsent) cell += "; 0 reads as if the key were absent";
    return cell;
}

/// The help on one line, without a plain "(default 32)": the table has a column for it (one that
/// says what a value means, "(default 0: never)", stays).
std::string oneLine(std::string text) {
    std::replace(text.begin(), text.end(), '\n', ' ');
    return std::regex_replace(text, std::regex(R"( ?\(default [^();:]*\))"), "");
}

}  // namespace

std::string optionsReference() {
    std::string out =
        "# Options reference\n\n"
        "Every option of a run: its key in a run configuration (JSON, see configuration.md), its flag\n"
        "(`batchpilot-cli --help`), its type and range, and its default. Generated from the one\n"
        "declaration of each option (`core/config/option_schema.cpp`) by\n"
        "`batchpilot-cli --options-reference`; the test `docs.options_reference` fails while this file\n"
        "differs (run `scripts/cli-reference`). The same ranges are checked when a configuration is read,\n"
        "when a flag is given and when the window's run panel starts a run.\n";
    std::string group;
    for (const OptionSpec& s : optionSchema()) {
        if (s.group != group) {
            group = s.group;
            out += "\n## " + group + "\n\n| key | flag | type and range | default | meaning |\n|---|---|---|---|---|\n";
        }
        std::string meaning = oneLine(s.reference.empty() ? s.help : s.reference);
        std::string flag = s.flag.empty() ? "—" : "`" + s.flag + "`";
        // A table cell cannot hold "|".
        std::replace(meaning.begin(), meaning.end(), '|', '/');
        out += "| `" + s.key + "` | " + flag + " | " + referenceRange(s) + " | `" + jsonText(optionDefault(s)) +
               "` | " + meaning + " |\n";
    }
    return out;
}

}  // namespace batchpilot::core
