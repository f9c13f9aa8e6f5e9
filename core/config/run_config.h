#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>
#include <tl/expected.hpp>

#include "core/config/options.h"

namespace batchpilot::core {

/// `value` as JSON text (indented by `indent`, or on one line). Text that is not UTF-8 — a Latin-1
/// file name, a CSV header from an older system — has each invalid byte written as U+FFFD rather
/// than the exception nlohmann::json throws for it, which ended the process.
std::string jsonText(const nlohmann::json& value, int indent = -1);

/// "an integer", "a string", …: what a JSON value is, for a message.
const char* jsonTypeName(const nlohmann::json& value);

/// Run configurations as JSON: the same options the CLI flags and the GUI's run panel set.
///
///     {
///       "model": {"name": "cnn", "norm": "group", "width": 32},
///       "data": {"name": "synthetic", "samples": 4096, "image_size": [3, 32, 32], "classes": 10, "seed": 1},
///       "device": "virtual:512MiB",
///       "target_batch": 4096,
///       "probe": {"initial_micro_batch": 1, "max_micro_batch": 0, "headroom": 0.05, "multiple_of": 8,
///                 "max_trials": 24, "tolerance": 0.02},
///       "optimizer": {"kind": "adam", "learning_rate": 0.001, "momentum": 0.9, "weight_decay": 0,
///                     "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
///       "steps": 200, "epochs": null, "seed": 0, "lr_scaling": "linear", "regrow_after_steps": 20, "threads": 0,
///       "checkpoint": {"directory": "runs/demo", "every_steps": 50}
///     }
///
/// "steps" and "epochs" are a number or null (no such limit); "epochs" without "steps" drops the
/// default step limit (setEpochs). Every key is optional; missing keys keep the value of `base`. Unknown keys, wrong
/// types and out-of-range values are errors that name the key path ("probe.headroom") and what is expected. Nothing is
/// returned from a half-read configuration.
tl::expected<TrainerOptions, std::string> parseRunConfig(const nlohmann::json& config, TrainerOptions base = {});

/// JSON text read strictly, as every JSON input of BatchPilot is (configuration files, the served
/// run's commands): refused when it is not valid JSON, holds a NUL byte (nlohmann::json would stop
/// there and take the text before it), gives a key twice in one object, or nests deeper than 32
/// levels. Messages start with `named` ("the configuration \"run.json\"", "the command").
tl::expected<nlohmann::json, std::string> parseJsonText(const std::string& content, const std::string& named);

/// The most bytes a run configuration's text may hold (a configuration is a few KiB): a larger
/// file, or a served run's configuration, is not read.
inline constexpr size_t kMaxRunConfigBytes = size_t{1} << 20;

/// Reads and parses a configuration file; errors name the file.
tl::expected<TrainerOptions, std::string> loadRunConfig(const std::string& path, TrainerOptions base = {});

/// Parses a configuration's text as loadRunConfig parses a file's: at most kMaxRunConfigBytes,
/// read by parseJsonText, then parseRunConfig. Errors start with `named` ("the configuration of
/// the run at http://…").
tl::expected<TrainerOptions, std::string> readRunConfigText(std::string_view text, const std::string& named,
                                                            TrainerOptions base = {});

/// The options as a configuration (every key present), readable by parseRunConfig.
nlohmann::json toRunConfig(const TrainerOptions& options);

/// Writes toRunConfig(options) to `path` through a temporary file and a rename.
tl::expected<void, std::string> saveRunConfig(const std::string& path, const TrainerOptions& options);

}  // namespace batchpilot::core
