#include "app/cli_args.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "core/dataset.h"
#include "core/device.h"
#include "core/model.h"
#include "core/model_factory.h"
#include "core/run_config.h"

namespace batchpilot::app {
namespace {

using core::TrainerOptions;

tl::expected<int64_t, std::string> parseInteger(const std::string& flag, const std::string& text, int64_t minimum) {
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || end != text.data() + text.size()) {
        return tl::unexpected(flag + " expects a whole number, got \"" + text + "\"");
    }
    if (value < minimum) {
        return tl::unexpected(flag + " must be at least " + std::to_string(minimum) + ", got " + text);
    }
    return value;
}

tl::expected<double, std::string> parseNumber(const std::string& flag, const std::string& text) {
    try {
        size_t used = 0;
        const double value = std::stod(text, &used);
        if (used == text.size() && std::isfinite(value)) return value;
        if (used == text.size()) return tl::unexpected(flag + " expects a finite number, got \"" + text + "\"");
    } catch (const std::exception&) {
    }
    return tl::unexpected(flag + " expects a number, got \"" + text + "\"");
}

/// "3x32x32" → channels, height, width; exactly three positive whole numbers.
tl::expected<void, std::string> parseImageSize(const std::string& text, core::DataOptions& data) {
    const std::string usage = "--image-size expects CxHxW such as 3x32x32, got \"" + text + "\"";
    int64_t parts[3] = {0, 0, 0};
    size_t start = 0;
    for (int i = 0; i < 3; ++i) {
        const size_t end = text.find('x', start);
        if ((i < 2) != (end != std::string::npos)) return tl::unexpected(usage);
        auto value = parseInteger("--image-size", text.substr(start, end == std::string::npos ? std::string::npos : end - start), 1);
        if (!value) return tl::unexpected(usage);
        parts[i] = *value;
        start = end + 1;
    }
    data.channels = parts[0];
    data.height = parts[1];
    data.width = parts[2];
    return {};
}

template <typename T>
tl::expected<void, std::string> store(tl::expected<T, std::string> parsed, T& into) {
    if (!parsed) return tl::unexpected(parsed.error());
    into = *parsed;
    return {};
}

}  // namespace

std::string cliHelp() {
    return R"(batchpilot-cli — train at the target batch you want on the device you have

Usage: batchpilot-cli [flags]

It probes the largest micro-batch that fits the device (trials that fit keep their gradients),
accumulates gradients exactly up to the target batch, and recovers from out-of-memory errors
without losing or repeating a sample.

Model and data
  --model NAME            mlp, cnn or resnet (default cnn), or a TorchScript file (.pt/.pth)
                          exported from Python: see README, "Your own model and data"
  --norm KIND             resnet normalisation: group (exact under accumulation) or batch
                          (default group)
  --width N               channels of the first stage / hidden-unit scale (default 32)
  --data NAME             synthetic (default): learnable generated images; mnist (IDX files),
                          image-folder (one subfolder per class) or csv (a table)
  --data-path PATH        the MNIST folder, image folder or CSV file to read
  --target-column NAME    csv: the column to predict (the others are numeric features)
  --image-size CxHxW      sample shape (default 3x32x32; 3x224x224 works); image-folder
                          resizes to it (C: 3 for RGB, 1 for grey)
  --classes N             number of classes (default 10)
  --samples N             dataset size (default 4096)
  --data-seed N           seed of the generated data (default 1)

Device and batch
  --device DEV            cpu, cuda:N or virtual:<size> — a simulated GPU with a memory budget,
                          e.g. virtual:512MiB (default cpu)
  --target-batch N        samples per optimizer step (default 64)
  --initial-micro-batch N first probe trial (default 1)
  --max-micro-batch N     upper limit for the micro-batch (default: none)
  --headroom F            fraction of device memory kept free, 0..0.9 (default 0.05)
  --multiple-of N         round the micro-batch down to a multiple of N (default 1)
  --max-trials N          probe trial limit (default 24)
  --regrow-after N        clean steps after an OOM before trying a larger micro-batch
                          (default 20, 0 = never)
  --cuda-memory-fraction F  cuda:N only: let this process use at most F (0..1] of the GPU's
                          memory, so that a large GPU runs out of memory like a small one

Optimisation
  --optimizer NAME        sgd (with momentum), adam or adamw (default sgd)
  --lr F                  learning rate (default 0.05)
  --momentum F            SGD momentum (default 0.9)
  --weight-decay F        L2 (sgd, adam) or decoupled (adamw) weight decay (default 0)
  --loss NAME             cross-entropy (classification, default) or mse (regression; with
                          csv the target column holds the values to predict)
  --steps N               optimizer steps to run (default 100 unless --epochs is given)
  --epochs N              passes over the data (used when --steps is not given)
  --seed N                model initialisation and sample order (default 0)
  --threads N             CPU threads for LibTorch, 1..256 (default: every CPU available)

Configuration
  --config FILE           read a JSON run configuration (see README); flags given too override it
  --save-config FILE      write the configuration these flags describe to FILE and exit

Checkpoints
  --checkpoint-dir DIR    save model, optimizer and trainer state to DIR/checkpoint.pt when the run
                          ends or is stopped (written atomically: a crash never corrupts it)
  --checkpoint-every N    also every N optimizer steps
  --resume DIR            continue exactly where the checkpoint in DIR left off (same model,
                          optimizer and data options, and its target batch); the step limit
                          counts from the start. Checkpoints then replace DIR/checkpoint.pt
                          unless --checkpoint-dir names another folder

Output
  --events FILE           write every event as JSON Lines to FILE
  --quiet                 print only the final summary
  --memory-report         after each probe, print where the device memory goes: the probe's
                          trials, the fitted memory model, and parameters, gradients, optimizer
                          state and activations at the next step
  --check-equivalence N   after the first step, check that accumulating the micro-batches gives
                          the gradient of one full pass over the first N samples of that batch
                          (0: the whole batch) and print the differences per parameter tensor
  --list-devices          print the devices of this machine and exit
  --help                  print this help and exit

Exit status: 0 on success, 1 when training failed, 2 on bad input.
)";
}

tl::expected<CliRequest, std::string> parseCli(const std::vector<std::string>& args) {
    CliRequest request;
    TrainerOptions& o = request.options;
    // A configuration file is read first; flags given with it override its values.
    for (size_t i = 0; i < args.size(); ++i) {
        std::string path;
        if (args[i] == "--config" && i + 1 < args.size()) path = args[i + 1];
        if (args[i].rfind("--config=", 0) == 0) path = args[i].substr(9);
        if (!path.empty()) {
            auto loaded = core::loadRunConfig(path);
            if (!loaded) return tl::unexpected(loaded.error());
            o = *loaded;
        }
    }
    using Handler = std::function<tl::expected<void, std::string>(const std::string&)>;
    const std::map<std::string, Handler> withValue = {
        {"--model", [&](const std::string& v) -> tl::expected<void, std::string> { o.model.name = v; return {}; }},
        {"--norm", [&](const std::string& v) { return store(core::parseNormKind(v), o.model.norm); }},
        {"--width", [&](const std::string& v) { return store(parseInteger("--width", v, 8), o.model.width); }},
        {"--data", [&](const std::string& v) -> tl::expected<void, std::string> { o.data.name = v; return {}; }},
        {"--data-path", [&](const std::string& v) -> tl::expected<void, std::string> { o.data.path = v; return {}; }},
        {"--target-column", [&](const std::string& v) -> tl::expected<void, std::string> { o.data.targetColumn = v; return {}; }},
        {"--loss", [&](const std::string& v) { return store(core::parseLossKind(v), o.loss); }},
        {"--image-size", [&](const std::string& v) { return parseImageSize(v, o.data); }},
        {"--classes", [&](const std::string& v) { return store(parseInteger("--classes", v, 2), o.data.classes); }},
        {"--samples", [&](const std::string& v) { return store(parseInteger("--samples", v, 1), o.data.samples); }},
        {"--data-seed", [&](const std::string& v) -> tl::expected<void, std::string> {
             auto n = parseInteger("--data-seed", v, 0);
             if (!n) return tl::unexpected(n.error());
             o.data.seed = static_cast<uint64_t>(*n);
             return {};
         }},
        {"--device", [&](const std::string& v) -> tl::expected<void, std::string> {
             auto device = core::parseDevice(v);
             if (!device) return tl::unexpected(device.error());
             o.device = device->name();
             return {};
         }},
        {"--target-batch", [&](const std::string& v) { return store(parseInteger("--target-batch", v, 1), o.targetBatch); }},
        {"--initial-micro-batch", [&](const std::string& v) { return store(parseInteger("--initial-micro-batch", v, 1), o.probe.initialMicroBatch); }},
        {"--max-micro-batch", [&](const std::string& v) { return store(parseInteger("--max-micro-batch", v, 1), o.probe.maxMicroBatch); }},
        {"--headroom", [&](const std::string& v) { return store(parseNumber("--headroom", v), o.probe.headroom); }},
        {"--cuda-memory-fraction",
         [&](const std::string& v) { return store(parseNumber("--cuda-memory-fraction", v), o.cudaMemoryFraction); }},
        {"--multiple-of", [&](const std::string& v) { return store(parseInteger("--multiple-of", v, 1), o.probe.multipleOf); }},
        {"--max-trials", [&](const std::string& v) -> tl::expected<void, std::string> {
             auto n = parseInteger("--max-trials", v, 1);
             if (!n) return tl::unexpected(n.error());
             o.probe.maxTrials = static_cast<int>(std::min<int64_t>(*n, 1000));
             return {};
         }},
        {"--regrow-after", [&](const std::string& v) -> tl::expected<void, std::string> {
             auto n = parseInteger("--regrow-after", v, 0);
             if (!n) return tl::unexpected(n.error());
             o.regrowAfterSteps = static_cast<int>(std::min<int64_t>(*n, 1000000));
             return {};
         }},
        {"--optimizer", [&](const std::string& v) { return store(core::parseOptimizerKind(v), o.optimizer.kind); }},
        {"--lr", [&](const std::string& v) { return store(parseNumber("--lr", v), o.optimizer.learningRate); }},
        {"--momentum", [&](const std::string& v) { return store(parseNumber("--momentum", v), o.optimizer.momentum); }},
        {"--weight-decay", [&](const std::string& v) { return store(parseNumber("--weight-decay", v), o.optimizer.weightDecay); }},
        {"--steps", [&](const std::string& v) { return store(parseInteger("--steps", v, 1), o.steps); }},
        {"--epochs", [&](const std::string& v) { return store(parseInteger("--epochs", v, 1), o.epochs); }},
        {"--seed", [&](const std::string& v) -> tl::expected<void, std::string> {
             auto n = parseInteger("--seed", v, 0);
             if (!n) return tl::unexpected(n.error());
             o.seed = static_cast<uint64_t>(*n);
             return {};
         }},
        {"--threads", [&](const std::string& v) -> tl::expected<void, std::string> {
             auto n = parseInteger("--threads", v, 1);
             if (!n) return tl::unexpected(n.error());
             if (*n > core::kMaxThreads) {
                 return tl::unexpected("--threads must be at most " + std::to_string(core::kMaxThreads) + ", got " + v);
             }
             o.intraOpThreads = static_cast<int>(*n);
             return {};
         }},
        {"--events", [&](const std::string& v) -> tl::expected<void, std::string> { request.eventsPath = v; return {}; }},
        {"--config", [&](const std::string&) -> tl::expected<void, std::string> { return {}; }},
        {"--checkpoint-dir", [&](const std::string& v) -> tl::expected<void, std::string> { o.checkpoint.directory = v; return {}; }},
        {"--checkpoint-every", [&](const std::string& v) { return store(parseInteger("--checkpoint-every", v, 1), o.checkpoint.everySteps); }},
        {"--resume", [&](const std::string& v) -> tl::expected<void, std::string> {
             o.resumeFrom = v;
             if (o.checkpoint.directory.empty()) o.checkpoint.directory = v;
             return {};
         }},
        {"--save-config", [&](const std::string& v) -> tl::expected<void, std::string> { request.saveConfigPath = v; return {}; }},
        {"--check-equivalence", [&](const std::string& v) { return store(parseInteger("--check-equivalence", v, 0), request.checkEquivalence); }},
    };
    std::set<std::string> given;  ///< flags given on the command line (not from the configuration)
    for (size_t i = 0; i < args.size(); ++i) {
        std::string flag = args[i];
        std::optional<std::string> value;
        if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
            value = flag.substr(eq + 1);
            flag = flag.substr(0, eq);
        }
        if (flag == "--help" || flag == "-h") { request.help = true; continue; }
        if (flag == "--list-devices") { request.listDevices = true; continue; }
        if (flag == "--quiet") { request.quiet = true; continue; }
        if (flag == "--memory-report") { request.memoryReport = true; continue; }
        const auto handler = withValue.find(flag);
        if (handler == withValue.end()) {
            return tl::unexpected("unknown flag \"" + flag + "\"; see --help for the flags");
        }
        if (!value) {
            if (i + 1 >= args.size()) return tl::unexpected(flag + " needs a value; see --help");
            value = args[++i];
        }
        if (auto ok = handler->second(*value); !ok) return tl::unexpected(ok.error());
        given.insert(flag);
    }
    if (!o.resumeFrom.empty() && given.contains("--target-batch")) {
        return tl::unexpected(std::string("--target-batch cannot be given with --resume: a resumed run continues at its "
                                          "checkpoint's target batch, so that it goes on exactly where it stopped; drop "
                                          "--target-batch, or start a new run without --resume"));
    }
    request.checkpointReplacesResumed = !o.resumeFrom.empty() && !given.contains("--checkpoint-dir") &&
                                        o.checkpoint.directory == o.resumeFrom;
    if (o.steps == 0 && o.epochs == 0) o.steps = 100;
    const auto models = core::builtinModelNames();
    if (std::find(models.begin(), models.end(), o.model.name) == models.end()) {
        if (!core::isModelFile(o.model.name)) {
            return tl::unexpected("unknown model \"" + o.model.name +
                                  "\": choose mlp, cnn or resnet, or give a TorchScript file (.pt or .pth)");
        }
        std::error_code ec;
        if (!std::filesystem::is_regular_file(o.model.name, ec)) {
            return tl::unexpected("model file " + o.model.name + " does not exist");
        }
    }
    const auto datasets = core::datasetNames();
    if (std::find(datasets.begin(), datasets.end(), o.data.name) == datasets.end()) {
        return tl::unexpected("unknown dataset \"" + o.data.name + "\": choose synthetic, mnist, image-folder or csv");
    }
    if (o.data.name != "synthetic" && o.data.path.empty()) {
        return tl::unexpected("--data " + o.data.name + " needs --data-path (the " +
                              (o.data.name == "csv" ? "CSV file" : "folder") + " to read)");
    }
    // A CSV trained with MSE predicts the target column's values rather than classes.
    if (o.data.name == "csv" && o.loss == core::LossKind::Mse) o.data.regression = true;
    if (auto ok = core::validate(o); !ok) return tl::unexpected(ok.error());
    return request;
}

}  // namespace batchpilot::app
