#include "app/cli_args.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <iomanip>
#include <limits>
#include <memory>
#include <sstream>
#include <type_traits>

#include <CLI/CLI.hpp>

#include "core/device/device.h"
#include "core/config/memory_savers.h"
#include "core/plan/gpu_plan.h"
#include "core/config/run_config.h"
#include "core/records/run_folder.h"

// The flags are declared once, with CLI11: each with its range or choices, its help text and
// what it sets. Ranges are core's limits (core/config/options.h), the ones the configuration file
// uses; core::resolve() then applies the rules every front end shares.

namespace batchpilot::app {
namespace {

using core::TrainerOptions;

// Validators see the flag's text before CLI11 converts it, so a message can say what was given.

CLI::Validator wholeNumber(int64_t minimum, int64_t maximum) {
    const std::string range = "from " + std::to_string(minimum) + " to " + std::to_string(maximum);
    return CLI::Validator(
        [=](std::string& text) -> std::string {
            int64_t value = 0;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
            if (ec == std::errc::result_out_of_range) return "expects a whole number " + range + ", got " + text;
            if (ec != std::errc{} || end != text.data() + text.size())
                return "expects a whole number, got \"" + text + "\"";
            if (value < minimum || value > maximum) return "must be " + range + ", got " + text;
            return {};
        },
        "", "");
}

/// Whole numbers are read as written, in decimal: CLI11 reads a leading 0 as octal ("010" as 8,
/// "0777" as 511), which no one who types a step count or a seed means: this transform, the first
/// validator of every whole-number flag, drops leading zeros before the checks and the conversion.
CLI::Validator decimalWhole() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            const size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
            size_t zeros = sign;
            while (zeros + 1 < text.size() && text[zeros] == '0') ++zeros;
            const bool digits =
                text.size() > sign && std::all_of(text.begin() + static_cast<std::ptrdiff_t>(sign), text.end(),
                                                  [](char c) { return c >= '0' && c <= '9'; });
            if (digits && zeros > sign) text.erase(sign, zeros - sign);
            return {};
        },
        "", "");
}

/// A text flag given an empty value (`--config ""`, or `--config "$UNSET"`) is a mistake, not a
/// request for the default: `--config ''` used to start a training run with no configuration.
CLI::Validator nonEmpty() {
    return CLI::Validator(
        [](const std::string& text) -> std::string {
            return text.empty() ? "is empty: give a value, or leave the flag out for the default" : std::string();
        },
        "", "");
}

/// Finite numbers in [minimum, maximum] (or [minimum, maximum) when `openMaximum`), and above
/// `minimum` when `positive`.
CLI::Validator realNumber(double minimum, double maximum, bool positive = false, bool openMaximum = false) {
    std::ostringstream range;
    range << std::setprecision(10)
          << (positive      ? "above "
              : openMaximum ? "at least "
                            : "from ")
          << minimum
          << (positive      ? " and at most "
              : openMaximum ? " and below "
                            : " to ")
          << maximum;
    return CLI::Validator(
        [=, range = range.str()](std::string& text) -> std::string {
            double value = 0;
            try {
                size_t used = 0;
                value = std::stod(text, &used);
                if (used != text.size()) return "expects a number, got \"" + text + "\"";
            } catch (const std::exception&) {
                return "expects a number, got \"" + text + "\"";
            }
            if (!std::isfinite(value)) return "expects a finite number, got \"" + text + "\"";
            const bool below = positive ? value <= minimum : value < minimum;
            const bool above = openMaximum ? value >= maximum : value > maximum;
            if (below || above) return "must be " + range + ", got " + text;
            return {};
        },
        "", "");
}

/// A name core parses (optimizer, loss, normalisation, device): core's own message on failure.
template <typename Parse>
CLI::Validator parsedBy(Parse parse) {
    return CLI::Validator(
        [parse](std::string& text) -> std::string {
            auto parsed = parse(text);
            return parsed ? std::string() : parsed.error();
        },
        "", "");
}

/// One of `names`.
CLI::Validator oneOf(std::vector<std::string> names) {
    return CLI::Validator(
        [names](std::string& text) -> std::string {
            if (std::find(names.begin(), names.end(), text) != names.end()) return {};
            return "unknown value \"" + text + "\": choose " + core::choiceList(names);
        },
        "", "");
}

/// "3x32x32": exactly three positive whole numbers.
tl::expected<std::array<int64_t, 3>, std::string> parseImageSize(const std::string& text) {
    std::array<int64_t, 3> parts{};
    const char* at = text.data();
    const char* last = text.data() + text.size();
    for (size_t i = 0; i < parts.size(); ++i) {
        const auto [end, ec] = std::from_chars(at, last, parts[i]);
        const bool separated = i + 1 < parts.size() ? end != last && *end == 'x' : end == last;
        if (ec != std::errc{} || !separated || parts[i] < 1) {
            return tl::unexpected("expects CxHxW such as 3x32x32, got \"" + text + "\"");
        }
        at = end + 1;
    }
    return parts;
}

/// The flags and what each sets. Values given on the command line are applied, in declaration
/// order, after the configuration file (so flags override it).
class Flags {
public:
    explicit Flags(CliRequest& request)
        : m_app("Train at the target batch you want on the device you have.", "batchpilot-cli") {
        declare(request);
    }

    CLI::App& app() { return m_app; }

    /// Applies every flag the command line gave.
    void apply(TrainerOptions& options) const {
        for (const auto& set : m_setters) set(options);
    }
    bool given(const std::string& name) const { return m_app.get_option(name)->count() > 0; }
    /// --devices as given (one comma-separated text).
    const std::string& devices() const { return m_devices; }
    bool equalShares() const { return m_equalShares; }

private:
    /// A flag with a value of type T; `set` stores it when the flag was given.
    template <typename T>
    CLI::Option* option(const std::string& name, const std::string& text,
                        std::function<void(TrainerOptions&, const T&)> set) {
        auto value = std::make_shared<T>();
        CLI::Option* flag = m_app.add_option(name, *value, text);
        if constexpr (std::is_integral_v<T>) flag->transform(decimalWhole());
        if constexpr (std::is_same_v<T, std::string>) flag->check(nonEmpty());
        m_setters.push_back([flag, value, set](TrainerOptions& o) {
            if (flag->count() > 0) set(o, *value);
        });
        return flag;
    }

    void declare(CliRequest& request);

    CLI::App m_app;
    std::string m_devices;
    bool m_equalShares = false;
    std::vector<std::function<void(TrainerOptions&)>> m_setters;
};

void Flags::declare(CliRequest& request) {
    const TrainerOptions d;  // defaults, for the help text
    const auto text = [](auto value) {
        std::ostringstream out;
        out << value;
        return out.str();
    };
    const int64_t maxBatch = core::kMaxTargetBatch;
    m_app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    m_app.allow_extras();  // reported below with a message of our own
    m_app.get_formatter()->column_width(28);
    m_app.footer(
        "It probes the largest micro-batch that fits the device (trials that fit keep their gradients),\n"
        "accumulates gradients exactly up to the target batch, and recovers from out-of-memory errors\n"
        "without losing or repeating a sample.\n\n"
        "Exit status: 0 on success, 1 when training failed, 2 on bad input, 4 when a checkpoint or\n"
        "the events file could not be written, 128+N when stopped by signal N.\n");

    std::string group = "Model and data";
    option<std::string>("--model",
                        "mlp, cnn or resnet (default " + d.model.name +
                            "), or a TorchScript file (.pt/.pth)\n"
                            "exported from Python: see docs/guide/own-model-and-data.md",
                        [](TrainerOptions& o, const std::string& v) { o.model.name = v; })
        ->type_name("NAME")
        ->group(group);
    option<std::string>("--norm", "resnet normalisation: group (exact under accumulation) or batch\n(default group)",
                        [](TrainerOptions& o, const std::string& v) { o.model.norm = *core::parseNormKind(v); })
        ->type_name("KIND")
        ->check(parsedBy(core::parseNormKind))
        ->group(group);
    option<int64_t>("--width", "channels of the first stage / hidden-unit scale (default " + text(d.model.width) + ")",
                    [](TrainerOptions& o, const int64_t& v) { o.model.width = v; })
        ->type_name("N")
        ->check(wholeNumber(core::kMinModelWidth, core::kMaxModelWidth))
        ->group(group);
    option<std::string>("--data",
                        "synthetic (default): learnable generated images; mnist (IDX files),\n"
                        "image-folder (one subfolder per class) or csv (a table)",
                        [](TrainerOptions& o, const std::string& v) { o.data.name = v; })
        ->type_name("NAME")
        ->check(oneOf(core::datasetNames()))
        ->group(group);
    option<std::string>("--data-path", "the MNIST folder, image folder or CSV file to read",
                        [](TrainerOptions& o, const std::string& v) { o.data.path = v; })
        ->type_name("PATH")
        ->group(group);
    option<std::string>("--target-column", "csv: the column to predict (the others are numeric features)",
                        [](TrainerOptions& o, const std::string& v) { o.data.targetColumn = v; })
        ->type_name("NAME")
        ->group(group);
    option<std::string>("--image-size",
                        "sample shape (default 3x32x32; 3x224x224 works); image-folder\n"
                        "resizes to it (C: 3 for RGB, 1 for grey)",
                        [](TrainerOptions& o, const std::string& v) {
                            const auto parts = *parseImageSize(v);
                            o.data.channels = parts[0];
                            o.data.height = parts[1];
                            o.data.width = parts[2];
                        })
        ->type_name("CxHxW")
        ->check(parsedBy(parseImageSize))
        ->group(group);
    option<int64_t>("--classes", "number of classes (default " + text(d.data.classes) + ")",
                    [](TrainerOptions& o, const int64_t& v) { o.data.classes = v; })
        ->type_name("N")
        ->check(wholeNumber(2, core::kMaxClasses))
        ->group(group);
    option<int64_t>("--samples", "dataset size (default " + text(d.data.samples) + ")",
                    [](TrainerOptions& o, const int64_t& v) { o.data.samples = v; })
        ->type_name("N")
        ->check(wholeNumber(1, core::kMaxSamples))
        ->group(group);
    option<int64_t>("--data-seed", "seed of the generated data (default " + text(d.data.seed) + ")",
                    [](TrainerOptions& o, const int64_t& v) { o.data.seed = static_cast<uint64_t>(v); })
        ->type_name("N")
        ->check(wholeNumber(0, std::numeric_limits<int64_t>::max()))
        ->group(group);

    group = "Device and batch";
    option<std::string>("--device",
                        "cpu, cuda:N or virtual:<size> — a simulated GPU with a memory budget,\n"
                        "e.g. virtual:512MiB; PyTorch's caching allocator simulated after a\n"
                        "slash: virtual:8GiB/caching, virtual:8GiB/expandable_segments:True\n"
                        "(docs/guide/virtual-gpu.md) (default " +
                            d.device + ")",
                        [](TrainerOptions& o, const std::string& v) { o.device = v; })  // resolve() canonicalises
        ->type_name("DEV")
        ->check(parsedBy([](const std::string& v) { return core::parseDevice(v); }))
        ->group(group);
    m_app
        .add_option("--devices", m_devices,
                    "train on several devices at once, one process each (data parallel):\n"
                    "a comma-separated list such as virtual:48MiB,virtual:192MiB or\n"
                    "cuda:0,cuda:1; each device probes its own micro-batch and trains a\n"
                    "share of every training batch (docs/guide/several-devices.md)")
        ->check(nonEmpty())
        ->type_name("DEV,DEV,...")
        ->group(group);
    m_app
        .add_option("--rank-timeout", request.rankTimeoutSeconds,
                    "several devices: seconds the ranks wait for each other (to join, and\n"
                    "at each step) before a missing rank ends the job (default 300)")
        ->transform(decimalWhole())
        ->type_name("S")
        ->check(wholeNumber(1, 86400))
        ->group(group);
    m_app
        .add_flag("--equal-shares", m_equalShares,
                  "several devices: every rank trains an equal share of each batch,\n"
                  "whatever its memory and speed (as DDP-style tools do), for comparison")
        ->group(group);
    option<int64_t>("--check-ranks-every",
                    "several devices: steps between checks that every rank holds the same\n"
                    "parameters (default " +
                        text(d.parameterCheckEvery) + "; 0: only at the end)",
                    [](TrainerOptions& o, const int64_t& v) { o.parameterCheckEvery = v; })
        ->type_name("N")
        ->check(wholeNumber(0, core::kMaxSteps))
        ->group(group);
    option<int64_t>("--target-batch", "samples per optimizer step (default " + text(d.targetBatch) + ")",
                    [](TrainerOptions& o, const int64_t& v) { o.targetBatch = v; })
        ->type_name("N")
        ->check(wholeNumber(1, maxBatch))
        ->group(group);
    option<int64_t>("--initial-micro-batch", "first probe trial (default " + text(d.probe.initialMicroBatch) + ")",
                    [](TrainerOptions& o, const int64_t& v) { o.probe.initialMicroBatch = v; })
        ->type_name("N")
        ->check(wholeNumber(1, maxBatch))
        ->group(group);
    option<int64_t>("--max-micro-batch", "upper limit for the micro-batch (default: none)",
                    [](TrainerOptions& o, const int64_t& v) { o.probe.maxMicroBatch = v; })
        ->type_name("N")
        ->check(wholeNumber(1, maxBatch))
        ->group(group);
    option<double>("--headroom", "fraction of device memory kept free, 0..0.9 (default " + text(d.probe.headroom) + ")",
                   [](TrainerOptions& o, const double& v) { o.probe.headroom = v; })
        ->type_name("F")
        ->check(realNumber(0.0, 0.9))
        ->group(group);
    option<std::string>(
        "--objective",
        "after finding the largest micro-batch that fits: fastest (default)\n"
        "times smaller sizes on real training micro-batches and keeps the one\n"
        "with the most samples/s; largest keeps the largest",
        [](TrainerOptions& o, const std::string& v) { o.probe.objective = *core::parseProbeObjective(v); })
        ->type_name("GOAL")
        ->check(parsedBy(core::parseProbeObjective))
        ->group(group);
    option<int64_t>("--retime-every",
                    "fastest: every N steps compare the throughput with the one after the\n"
                    "decision and time the sizes again when it drifted (default: never)",
                    [](TrainerOptions& o, const int64_t& v) { o.probe.retimeEvery = v; })
        ->type_name("N")
        ->check(wholeNumber(0, core::kMaxRetimeEvery))
        ->group(group);
    option<double>("--retime-drift",
                   "the drift that --retime-every acts on, a fraction (default " + text(d.probe.retimeDrift) + ")",
                   [](TrainerOptions& o, const double& v) { o.probe.retimeDrift = v; })
        ->type_name("F")
        ->check(realNumber(0.01, 10.0))
        ->group(group);
    option<int64_t>("--multiple-of",
                    "round the micro-batch down to a multiple of N (default " + text(d.probe.multipleOf) + ")",
                    [](TrainerOptions& o, const int64_t& v) { o.probe.multipleOf = v; })
        ->type_name("N")
        ->check(wholeNumber(1, maxBatch))
        ->group(group);
    option<int64_t>("--max-trials", "probe trial limit (default " + text(d.probe.maxTrials) + ")",
                    [](TrainerOptions& o, const int64_t& v) { o.probe.maxTrials = static_cast<int>(v); })
        ->type_name("N")
        ->check(wholeNumber(1, core::kMaxProbeTrials))
        ->group(group);
    option<int64_t>("--regrow-after",
                    "clean steps after an OOM before trying a larger micro-batch\n"
                    "(default " +
                        text(d.regrowAfterSteps) + ", 0 = never)",
                    [](TrainerOptions& o, const int64_t& v) { o.regrowAfterSteps = static_cast<int>(v); })
        ->type_name("N")
        ->check(wholeNumber(0, core::kMaxRegrowAfterSteps))
        ->group(group);
    option<double>("--cuda-memory-fraction",
                   "cuda:N only: let this process use at most F (0..1] of the GPU's\n"
                   "memory, so that a large GPU runs out of memory like a small one",
                   [](TrainerOptions& o, const double& v) { o.cudaMemoryFraction = v; })
        ->type_name("F")
        ->check(realNumber(0.0, 1.0, true))
        ->group(group);

    group = "Optimisation";
    option<std::string>(
        "--optimizer", "sgd (with momentum), adam or adamw (default sgd)",
        [](TrainerOptions& o, const std::string& v) { o.optimizer.kind = *core::parseOptimizerKind(v); })
        ->type_name("NAME")
        ->check(parsedBy(core::parseOptimizerKind))
        ->group(group);
    option<double>("--lr", "learning rate (default " + text(d.optimizer.learningRate) + ")",
                   [](TrainerOptions& o, const double& v) { o.optimizer.learningRate = v; })
        ->type_name("F")
        ->check(realNumber(0.0, core::kMaxLearningRate, true))
        ->group(group);
    option<double>("--momentum", "SGD momentum (default " + text(d.optimizer.momentum) + ")",
                   [](TrainerOptions& o, const double& v) { o.optimizer.momentum = v; })
        ->type_name("F")
        ->check(realNumber(0.0, 1.0, false, true))
        ->group(group);
    option<double>("--weight-decay", "L2 (sgd, adam) or decoupled (adamw) weight decay (default 0)",
                   [](TrainerOptions& o, const double& v) { o.optimizer.weightDecay = v; })
        ->type_name("F")
        ->check(realNumber(0.0, core::kMaxWeightDecay))
        ->group(group);
    option<std::string>("--lr-scaling",
                        "how the learning rate follows a change of the target batch during a\n"
                        "run: none (default), linear or sqrt",
                        [](TrainerOptions& o, const std::string& v) { o.lrScaling = *core::parseLrScaling(v); })
        ->type_name("RULE")
        ->check(parsedBy(core::parseLrScaling))
        ->group(group);
    option<std::string>("--loss",
                        "cross-entropy (classification, default) or mse (regression; with\n"
                        "csv the target column holds the values to predict)",
                        [](TrainerOptions& o, const std::string& v) { o.loss = *core::parseLossKind(v); })
        ->type_name("NAME")
        ->check(parsedBy(core::parseLossKind))
        ->group(group);
    option<std::string>("--memory-savers",
                        "trade speed or precision for memory: checkpoint (recompute activations\n"
                        "in backward), bf16 (bfloat16 autocast), both, fp16 (float16 autocast with\n"
                        "loss scaling, for GPUs without fast bfloat16), checkpoint-fp16, auto\n"
                        "(measure them when the micro-batch is small or nothing fits, and use the\n"
                        "fastest) or off (default)",
                        [](TrainerOptions& o, const std::string& v) { o.memorySavers = *core::parseMemorySavers(v); })
        ->type_name("SAVERS")
        ->check(parsedBy(core::parseMemorySavers))
        ->group(group);
    option<int64_t>("--saver-threshold",
                    "measure every memory saver when the probe finds a micro-batch below N\n"
                    "(and below the target batch), and suggest the fastest (default " +
                        text(d.saverThreshold) + "; 0: only when nothing fits)",
                    [](TrainerOptions& o, const int64_t& v) { o.saverThreshold = v; })
        ->type_name("N")
        ->check(wholeNumber(0, core::kMaxTargetBatch))
        ->group(group);
    option<double>("--loss-scale",
                   "fp16 memory savers: the loss scale to start from (default " + text(d.lossScale) +
                       "); halved\nwhen gradients overflow float16 (the batch is trained again), doubled after\n" +
                       text(core::kLossScaleGrowthSteps) + " steps without",
                   [](TrainerOptions& o, const double& v) { o.lossScale = v; })
        ->type_name("S")
        ->check(realNumber(1.0, core::kMaxLossScale))
        ->group(group);
    option<int64_t>("--steps",
                    "optimizer steps to run (default " + text(core::kDefaultSteps) + " unless --epochs is given)",
                    [](TrainerOptions& o, const int64_t& v) { o.steps = v; })
        ->type_name("N")
        ->check(wholeNumber(1, core::kMaxSteps))
        ->group(group);
    option<int64_t>("--epochs", "passes over the data (with --steps too, whichever ends first)",
                    [this](TrainerOptions& o, const int64_t& v) { core::setEpochs(o, v, given("--steps")); })
        ->type_name("N")
        ->check(wholeNumber(1, core::kMaxEpochs))
        ->group(group);
    option<int64_t>("--seed", "model initialisation and sample order (default " + text(d.seed) + ")",
                    [](TrainerOptions& o, const int64_t& v) { o.seed = static_cast<uint64_t>(v); })
        ->type_name("N")
        ->check(wholeNumber(0, std::numeric_limits<int64_t>::max()))
        ->group(group);
    option<int64_t>("--threads",
                    "CPU threads for LibTorch, 1.." + text(core::kMaxThreads) + " (default: every CPU available)",
                    [](TrainerOptions& o, const int64_t& v) { o.intraOpThreads = static_cast<int>(v); })
        ->type_name("N")
        ->check(wholeNumber(1, core::kMaxThreads))
        ->group(group);

    group = "Configuration";
    m_app
        .add_option("--config", request.configPath,
                    "read a JSON run configuration (docs/reference/configuration.md); flags given too override it")
        ->check(nonEmpty())
        ->type_name("FILE")
        ->group(group);
    m_app
        .add_option("--save-config", request.saveConfigPath,
                    "write the configuration these flags describe to FILE and exit")
        ->check(nonEmpty())
        ->type_name("FILE")
        ->group(group);

    group = "Validation";
    option<double>("--validation-split",
                   "share of the data held out for validation, 0..0.9, drawn from the data\n"
                   "seed (default 0.1; synthetic data gets that share of extra samples of\n"
                   "its own); 0: no validation",
                   [](TrainerOptions& o, const double& v) { o.validation.split = v; })
        ->type_name("F")
        ->check(realNumber(0.0, 0.9))
        ->group(group);
    option<std::string>("--validation-data",
                        "evaluate this file or folder instead of a held-out share (the training\n"
                        "data's format, e.g. MNIST's t10k-images-idx3-ubyte)",
                        [](TrainerOptions& o, const std::string& v) { o.validation.path = v; })
        ->type_name("PATH")
        ->group(group);
    option<int64_t>("--validate-every", "validate every N optimizer steps (default: at the end of each epoch)",
                    [](TrainerOptions& o, const int64_t& v) { o.validation.everySteps = v; })
        ->type_name("N")
        ->check(wholeNumber(1, core::kMaxSteps))
        ->group(group);

    group = "Checkpoints";
    option<std::string>("--checkpoint-dir",
                        "save model, optimizer and trainer state to DIR/checkpoint.pt when the run\n"
                        "ends or is stopped (written atomically: a crash never corrupts it)",
                        [](TrainerOptions& o, const std::string& v) { o.checkpoint.directory = v; })
        ->type_name("DIR")
        ->group(group);
    option<int64_t>("--checkpoint-every",
                    "also every N optimizer steps (without --checkpoint-dir: in the run\n"
                    "folder's checkpoint/)",
                    [](TrainerOptions& o, const int64_t& v) { o.checkpoint.everySteps = v; })
        ->type_name("N")
        ->check(wholeNumber(1, core::kMaxSteps))
        ->group(group);
    option<std::string>("--keep-best",
                        "also keep the model that scored best so far on this validation metric\n"
                        "in CHECKPOINT_DIR/best (val_loss, val_accuracy, val_top5_accuracy,\n"
                        "val_mse, val_mae; without --checkpoint-dir: in the run folder's\n"
                        "checkpoint/best); resume from it or load its model like any checkpoint",
                        [](TrainerOptions& o, const std::string& v) { o.checkpoint.keepBest = v; })
        ->type_name("METRIC")
        ->group(group);
    option<std::string>("--resume",
                        "continue exactly where the checkpoint in DIR left off (same model,\n"
                        "optimizer and data options, and its target batch); the step limit\n"
                        "counts from the start. Checkpoints then replace DIR/checkpoint.pt\n"
                        "unless --checkpoint-dir names another folder",
                        [](TrainerOptions& o, const std::string& v) {
                            o.resumeFrom = v;
                            if (o.checkpoint.directory.empty())
                                o.checkpoint.directory = core::resumedCheckpointDirectory(v);
                        })
        ->type_name("DIR")
        ->group(group);

    group = "Output";
    m_app.add_option("--events", request.eventsPath, "write every event as JSON Lines to FILE")
        ->check(nonEmpty())
        ->type_name("FILE")
        ->group(group);
    m_app
        .add_option("--runs-dir", request.runsDirectory,
                    "keep this run's folder (config.json, events.jsonl, summary.json) under\n"
                    "DIR (default: $BATCHPILOT_RUNS_DIR, else ~/.local/share/batchpilot/runs)")
        ->check(nonEmpty())
        ->type_name("DIR")
        ->group(group);
    m_app.add_flag("--no-run-folder", request.noRunFolder, "do not record this run in a run folder")->group(group);
    m_app
        .add_option("--export-csv", request.exportCsv,
                    "write every series of the run in RUN_FOLDER (loss, validation, memory,\n"
                    "throughput, probe trials) as one CSV table and exit")
        ->check(nonEmpty())
        ->type_name("RUN_FOLDER")
        ->group(group);
    m_app.add_option("--csv-out", request.csvOut, "where --export-csv writes (default RUN_FOLDER/series.csv)")
        ->check(nonEmpty())
        ->type_name("FILE")
        ->group(group);
    m_app.add_flag("--quiet", request.quiet, "print only the final summary")->group(group);
    m_app
        .add_flag("--memory-report", request.memoryReport,
                  "after each probe, print where the device memory goes: the probe's\n"
                  "trials, the fitted memory model, and parameters, gradients, optimizer\n"
                  "state and activations at the next step")
        ->group(group);
    m_app
        .add_option("--plan-for", request.planFor,
                    "after the first probe, predict the plan on each GPU named (all, or\n"
                    "some of " +
                        core::gpuPresetNames() +
                        "):\n"
                        "the largest micro-batch and the accumulation for the target batch,\n"
                        "from the memory line the probe measured (docs/guide/virtual-gpu.md)")
        ->check(parsedBy([](const std::string& v) { return core::gpuPlanTargets(v); }))
        ->type_name("GPUS")
        ->group(group);
    m_app
        .add_option("--memory-snapshot", request.memorySnapshot,
                    "write the virtual GPU's segments and blocks, as they were at the run's\n"
                    "last out-of-memory error (else at its end), as PyTorch's memory\n"
                    "snapshot: open FILE at https://pytorch.org/memory_viz")
        ->type_name("FILE")
        ->group(group);
    m_app
        .add_option("--check-equivalence", request.checkEquivalence,
                    "after the first step, check that accumulating the micro-batches gives\n"
                    "the gradient of one full pass over the first N samples of that batch\n"
                    "(0: the whole batch) and print the differences per parameter tensor")
        ->transform(decimalWhole())
        ->type_name("N")
        ->check(wholeNumber(0, maxBatch))
        ->group(group);
    m_app.add_flag("--list-devices", request.listDevices, "print the devices of this machine and exit")->group(group);
    m_app.set_help_flag("-h,--help", "print this help and exit")->group(group);
}

}  // namespace

std::string cliHelp() {
    CliRequest request;
    Flags flags(request);
    return flags.app().help();
}

tl::expected<CliRequest, std::string> parseCli(const std::vector<std::string>& args) {
    CliRequest request;
    Flags flags(request);
    CLI::App& app = flags.app();
    try {
        std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
        app.parse(reversed);
    } catch (const CLI::CallForHelp&) {
        request.help = true;
        return request;
    } catch (const CLI::ArgumentMismatch& e) {
        // The only mismatch a value flag can have here: it was last, with nothing after it.
        std::string message = e.what();
        const auto colon = message.find(':');
        return tl::unexpected((colon == std::string::npos ? message : message.substr(0, colon) + " needs a value") +
                              "; see --help");
    } catch (const CLI::ParseError& e) {
        return tl::unexpected(std::string(e.what()));
    }
    if (const auto extra = app.remaining(); !extra.empty()) {
        const std::string& first = extra.front();
        return tl::unexpected(first.rfind("-", 0) == 0
                                  ? "unknown flag \"" + first.substr(0, first.find('=')) +
                                        "\"; see --help for the flags"
                                  : "unexpected argument \"" + first + "\": every value follows its flag; see --help");
    }
    TrainerOptions& o = request.options;
    if (!request.configPath.empty()) {
        // A configuration file is read first; flags given with it override its values.
        auto loaded = core::loadRunConfig(request.configPath);
        if (!loaded) return tl::unexpected(loaded.error());
        o = *loaded;
    }
    flags.apply(o);
    if (!o.resumeFrom.empty() && flags.given("--target-batch")) {
        return tl::unexpected(
            std::string("--target-batch cannot be given with --resume: a resumed run continues at its "
                        "checkpoint's target batch, so that it goes on exactly where it stopped; drop "
                        "--target-batch, or start a new run without --resume"));
    }
    if (core::checkpointsInRunFolder(o) && request.noRunFolder) {
        const char* asked =
            !o.checkpoint.keepBest.empty()
                ? (flags.given("--keep-best") ? "--keep-best" : "checkpoint.keep_best (configuration)")
                : (flags.given("--checkpoint-every") ? "--checkpoint-every" : "checkpoint.every_steps (configuration)");
        return tl::unexpected(std::string(asked) +
                              " without --checkpoint-dir keeps the checkpoints in the run's folder, but "
                              "--no-run-folder was given: name a folder with --checkpoint-dir DIR");
    }
    if (!flags.devices().empty()) {
        if (flags.given("--device")) {
            return tl::unexpected(std::string(
                "--device and --devices were both given: --devices names every device of the job (the first "
                "is rank 0); drop --device"));
        }
        std::string list = flags.devices();
        for (size_t start = 0; start <= list.size();) {
            const size_t comma = std::min(list.find(',', start), list.size());
            const std::string one = list.substr(start, comma - start);
            auto device = core::parseDevice(one);
            if (!device) return tl::unexpected("--devices \"" + list + "\": " + device.error());
            request.devices.push_back(device->name());
            start = comma + 1;
        }
        if (request.devices.size() < 2) {
            return tl::unexpected("--devices \"" + list +
                                  "\" names one device: list two or more (e.g. virtual:48MiB,virtual:192MiB), "
                                  "or train on one with --device");
        }
        o.device = request.devices.front();  // checked with the other options below
    }
    if (flags.equalShares()) o.balanceShares = false;
    request.checkpointReplacesResumed = !o.resumeFrom.empty() && !flags.given("--checkpoint-dir") &&
                                        o.checkpoint.directory == core::resumedCheckpointDirectory(o.resumeFrom);
    auto resolved = core::resolve(std::move(o));
    if (!resolved) return tl::unexpected(resolved.error().message);
    request.options = std::move(*resolved);
    // resolve() reads the device's name only; whether it exists is this machine's question.
    if (auto device = core::parseDevice(request.options.device); !device) return tl::unexpected(device.error());
    return request;
}

}  // namespace batchpilot::app
