#include "app/cli_args.h"

#include <algorithm>
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
#include "core/config/option_schema.h"
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

/// A whole number from `minimum` to `maximum`, for the flags that are not options of a run (the
/// others are core's schema's): read by the schema's rule (in decimal as written, "010" is ten,
/// not CLI11's octal eight), and handed on to CLI11 in plain decimal.
CLI::Validator wholeNumber(int64_t minimum, int64_t maximum) {
    core::OptionSpec spec;
    spec.type = core::OptionType::Integer;
    spec.minimum = minimum;
    spec.maximum = maximum;
    return CLI::Validator(
        [spec](std::string& text) -> std::string {
            const auto value = core::optionValueFromText(spec, text);
            if (!value) return value.error();
            text = std::to_string(value->get<int64_t>());
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
    tl::expected<void, std::string> apply(TrainerOptions& options) const {
        core::OptionReading reading;
        for (const auto& set : m_setters) {
            if (auto ok = set(options, reading); !ok) return ok;
        }
        core::finishReading(options, reading);
        return {};
    }
    bool given(const std::string& name) const { return m_app.get_option(name)->count() > 0; }
    /// --devices as given (one comma-separated text).
    const std::string& devices() const { return m_devices; }

private:
    using Setter = std::function<tl::expected<void, std::string>(TrainerOptions&, core::OptionReading&)>;

    /// The flag of one option of core's schema (core/config/option_schema.h): its text is
    /// checked and converted by the schema, then read exactly as a configuration's value.
    CLI::Option* option(const core::OptionSpec& spec) {
        CLI::Option* flag = nullptr;
        if (spec.type == core::OptionType::Boolean) {
            auto on = std::make_shared<bool>(false);
            flag = m_app.add_flag(spec.flag, *on, spec.help);
            m_setters.push_back([flag, on, &spec](TrainerOptions& o, core::OptionReading& r) {
                if (flag->count() == 0) return tl::expected<void, std::string>();
                return core::readOption(spec, nlohmann::json(*on), spec.flag, o, r);  // --flag=false too
            });
        } else {
            auto text = std::make_shared<std::string>();
            flag = m_app.add_option(spec.flag, *text, spec.help)->type_name(spec.valueName);
            flag->check(CLI::Validator(
                [&spec](std::string& given) -> std::string {
                    auto value = core::optionValueFromText(spec, given);
                    return value ? std::string() : value.error();
                },
                "", ""));
            m_setters.push_back([flag, text, &spec](TrainerOptions& o, core::OptionReading& r) {
                if (flag->count() == 0) return tl::expected<void, std::string>();
                auto value = core::optionValueFromText(spec, *text);
                if (!value) return tl::expected<void, std::string>(tl::unexpected(spec.flag + ": " + value.error()));
                return core::readOption(spec, *value, spec.flag, o, r);
            });
        }
        return flag->group(spec.group);
    }

    void declare(CliRequest& request);
    /// The flags of the command line only (not options of a run), declared after `key`'s.
    void declareAfter(const std::string& key, CliRequest& request);

    CLI::App m_app;
    std::string m_devices;
    std::vector<Setter> m_setters;
};

void Flags::declare(CliRequest& request) {
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

    for (const core::OptionSpec& spec : core::optionSchema()) {
        if (spec.flag.empty()) continue;  // configuration only
        CLI::Option* flag = option(spec);
        // Whether the device exists is this machine's question, asked by the engine's parser.
        if (spec.key == "device") flag->check(parsedBy([](const std::string& v) { return core::parseDevice(v); }));
        declareAfter(spec.key, request);
    }

    std::string group = "Configuration";
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
        .add_option("--serve", request.serve,
                    "serve the run over HTTP on [ADDR:]PORT (loopback unless ADDR is given;\n"
                    "0: any free port) for the window's File > Connect to run: its events\n"
                    "from the start and its commands, with tokens written to the run\n"
                    "folder's serve.json; from elsewhere: ssh -L PORT:localhost:PORT HOST")
        ->check(nonEmpty())
        ->type_name("[ADDR:]PORT")
        ->group(group);
    m_app
        .add_flag("--serve-any-address", request.serveAnyAddress,
                  "allow --serve on an address other than loopback (anyone who reaches it\n"
                  "can watch; the control token, sent unencrypted, steers)")
        ->group(group);
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
        ->transform(wholeNumber(0, maxBatch))
        ->type_name("N")
        ->group(group);
    m_app.add_flag("--list-devices", request.listDevices, "print the devices of this machine and exit")->group(group);
    m_app
        .add_flag("--options-reference", request.optionsReference,
                  "print every option of a run (configuration key, flag, range, default)\n"
                  "as the Markdown tables of docs/reference/options.md, and exit")
        ->group(group);
    m_app.set_help_flag("-h,--help", "print this help and exit")->group(group);
}

void Flags::declareAfter(const std::string& key, CliRequest& request) {
    if (key == "device") {
        const std::string group = "Device and batch";
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
            ->transform(wholeNumber(1, 86400))
            ->type_name("S")
            ->group(group);
    } else if (key == "checkpoint.keep_best") {
        auto folder = std::make_shared<std::string>();
        CLI::Option* flag = m_app
                                .add_option("--resume", *folder,
                                            "continue exactly where the checkpoint in DIR left off (same model,\n"
                                            "optimizer and data options, and its target batch); the step limit\n"
                                            "counts from the start. Checkpoints then replace DIR/checkpoint.pt\n"
                                            "unless --checkpoint-dir names another folder")
                                ->check(nonEmpty())
                                ->type_name("DIR")
                                ->group("Checkpoints");
        m_setters.push_back([flag, folder](TrainerOptions& o, core::OptionReading&) {
            if (flag->count() > 0) {
                o.resumeFrom = *folder;
                if (o.checkpoint.directory.empty()) o.checkpoint.directory = core::resumedCheckpointDirectory(*folder);
            }
            return tl::expected<void, std::string>();
        });
    }
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
    if (auto applied = flags.apply(o); !applied) return tl::unexpected(applied.error());
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
