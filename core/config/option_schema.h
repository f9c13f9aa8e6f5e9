#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tl/expected.hpp>

#include "core/config/options.h"

/// Every run option a user can set, declared once: its configuration key, its command-line flag,
/// its type, range, default and help text. The configuration reader and writer
/// (core/config/run_config.h), the CLI's flags (app/cli_args.cpp), the range checks of check(),
/// the window's field limits (ui/config/run_panel.cpp) and the reference table
/// (docs/reference/options.md, printed by `batchpilot-cli --options-reference`) all come from
/// optionSchema(). Adding an option is one OptionSpec in option_schema.cpp and its use.
namespace batchpilot::core {

/// What an option's value is.
enum class OptionType {
    Integer,    ///< a whole number in [minimum, maximum]
    Number,     ///< a finite number in [low, high] (either end may be open)
    Text,       ///< text: a name or a path; `checkText` may refuse some
    Choice,     ///< one of `choices` (the parser behind `checkText` may accept aliases)
    Boolean,    ///< true or false; on the command line a flag without a value
    ImageSize,  ///< [channels, height, width] in a configuration, CxHxW on the command line
};

/// Carried from one option's setter to the next while one source (a configuration, or the flags)
/// is applied: "epochs" without "steps" in the same source drops the default step limit
/// (setEpochs), whichever of the two comes first.
struct OptionReading {
    bool stepsGiven = false;
    bool optimizerGiven = false;     ///< optimizer.kind was read
    bool learningRateGiven = false;  ///< optimizer.learning_rate was read
    std::optional<int64_t> epochs;
};

/// One option. Values travel as JSON whatever their source: the command line's text is converted
/// (optionValueFromText) and then read exactly as a configuration's value is.
struct OptionSpec {
    std::string key;    ///< configuration key path: "probe.headroom"
    std::string flag;   ///< "--headroom"; empty: configuration only
    std::string group;  ///< section of --help and of the reference: "Device and batch"
    std::string label;  ///< in messages: "headroom"
    OptionType type = OptionType::Text;
    std::string valueName;  ///< in --help: N, F, NAME, PATH
    std::string help;       ///< --help's text for the flag (lines broken by hand at ~72 characters)
    std::string reference;  ///< the reference table's meaning cell (empty: the help, on one line)
    int64_t minimum = 0;    ///< Integer
    int64_t maximum = std::numeric_limits<int64_t>::max();
    double low = 0.0;  ///< Number
    double high = 0.0;
    bool lowOpen = false;   ///< Number: above `low`, not `low` itself
    bool highOpen = false;  ///< Number: below `high`
    /// What JSON null means ("no step limit"); empty: null is refused.
    std::string nullMeans;
    /// A configuration's 0 reads as if the key were absent (older versions wrote 0 for "unset").
    bool zeroIsAbsent = false;
    std::vector<std::string> choices;  ///< Choice: the names written (and listed)
    /// Text and Choice: core's own parser of the value; its message when it refuses.
    std::function<tl::expected<void, std::string>(const std::string&)> checkText;
    /// The value in `options`, as a configuration holds it.
    std::function<nlohmann::json(const TrainerOptions&)> get;
    /// Stores a value that readOption() has checked.
    std::function<void(TrainerOptions&, const nlohmann::json&, OptionReading&)> set;
};

/// Every option, in the order of --help and the reference.
const std::vector<OptionSpec>& optionSchema();
/// The option with configuration key `key` ("probe.headroom"), or null.
const OptionSpec* findOption(const std::string& key);
/// The option behind `flag` ("--headroom"), or null.
const OptionSpec* findFlag(const std::string& flag);
/// The option's default: its value in a default TrainerOptions.
nlohmann::json optionDefault(const OptionSpec& spec);

/// Checks `value` against the option's type and range and stores it; the message names `where`
/// (the key path, "probe.headroom", or the flag) and what was expected.
tl::expected<void, std::string> readOption(const OptionSpec& spec, const nlohmann::json& value,
                                           const std::string& where, TrainerOptions& options, OptionReading& reading);
/// Checks a value of an Integer or Number option against its type and range as readOption() does,
/// without storing it: for other files that carry an option's value (a checkpoint's target batch),
/// in the configuration's words, "target_batch: expected an integer from 1 to 2147483648, got 0"
/// (`where` first).
tl::expected<void, std::string> checkOptionNumber(const OptionSpec& spec, const nlohmann::json& value,
                                                  const std::string& where);
/// The same words for a whole number that is no option's (a checkpoint's step): "step: expected an
/// integer from 0 to 1099511627776, got -1"; a maximum of INT64_MAX reads "from 0 up".
tl::expected<void, std::string> checkInteger(int64_t value, int64_t minimum, int64_t maximum, const std::string& where);
/// Applies what one source implied for others (the epochs/steps rule); after its last option.
void finishReading(TrainerOptions& options, const OptionReading& reading);

/// The command line's text as the value readOption() takes: a whole number (in decimal: "010" is
/// ten), a finite number in range, CxHxW, a name core's parser accepts, or the text itself. The
/// message is the command line's ("must be from 1 to 1000, got 5000"), without the flag's name.
tl::expected<nlohmann::json, std::string> optionValueFromText(const OptionSpec& spec, const std::string& text);
/// An Integer or Number option's range in words: "from 1 to 1000", "above 0 and at most 1000000",
/// "at least 0 and below 1".
std::string rangeText(const OptionSpec& spec);
/// The first Integer or Number option whose value in `options` is out of its range (check()).
tl::expected<void, OptionProblem> checkRanges(const TrainerOptions& options);

/// The reference table of every option (Markdown), one section per group.
std::string optionsReference();

}  // namespace batchpilot::core
