#include "core/config/run_config.h"

#include <algorithm>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "core/config/device_spec.h"
#include "core/base/durable_file.h"

namespace batchpilot::core {
namespace {

using nlohmann::json;

/// A run configuration is a few KiB; a larger file is not one (and is never echoed in full).
constexpr size_t kMaxConfigBytes = size_t{1} << 20;
/// Deeper nesting is refused while parsing (the configuration's own depth is 3).
constexpr int kMaxConfigDepth = 32;

const char* typeName(const json& value) {
    if (value.is_boolean()) return "a boolean";
    if (value.is_number_integer() || value.is_number_unsigned()) return "an integer";
    if (value.is_number()) return "a number";
    if (value.is_string()) return "a string";
    if (value.is_array()) return "an array";
    if (value.is_object()) return "an object";
    return "null";
}

std::string shown(const json& value) {
    std::string text = jsonText(value);
    return text.size() > 40 ? text.substr(0, 37) + "..." : text;
}

/// Thrown inside the parser only, turned into the returned message.
struct ConfigError {
    std::string message;
};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw ConfigError{path + ": " + what};
}

int64_t integer(const json& v, const std::string& path, int64_t minimum,
                int64_t maximum = std::numeric_limits<int64_t>::max()) {
    if (!v.is_number_integer() && !v.is_number_unsigned()) {
        fail(path, std::string("expected an integer, got ") + typeName(v) + " " + shown(v));
    }
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(path, "expected an integer from " + std::to_string(minimum) +
                       (maximum == std::numeric_limits<int64_t>::max() ? " up" : " to " + std::to_string(maximum)) +
                       ", got " + std::to_string(v.get<uint64_t>()));
    }
    const auto n = v.get<int64_t>();
    if (n < minimum || n > maximum) {
        fail(path, "expected an integer from " + std::to_string(minimum) +
                       (maximum == std::numeric_limits<int64_t>::max() ? " up" : " to " + std::to_string(maximum)) +
                       ", got " + std::to_string(n));
    }
    return n;
}

double number(const json& v, const std::string& path, double minimum, double maximum, bool openMaximum = false) {
    if (!v.is_number()) fail(path, std::string("expected a number, got ") + typeName(v) + " " + shown(v));
    const auto x = v.get<double>();
    if (!std::isfinite(x) || x < minimum || x > maximum || (openMaximum && x >= maximum)) {
        std::ostringstream range;
        range << "expected a number in [" << minimum << ", " << maximum << (openMaximum ? ")" : "]") << ", got " << x;
        fail(path, range.str());
    }
    return x;
}

std::string text(const json& v, const std::string& path) {
    if (!v.is_string()) fail(path, std::string("expected a string, got ") + typeName(v) + " " + shown(v));
    return v.get<std::string>();
}

template <typename T>
T parsed(tl::expected<T, std::string> result, const std::string& path) {
    if (!result) fail(path, result.error());
    return *result;
}

using Field = std::function<void(const json&, const std::string&)>;

/// Applies `fields` to the members of `object`; any other key is an error listing the known ones.
void readObject(const json& object, const std::string& path, const std::map<std::string, Field>& fields) {
    if (!object.is_object()) {
        fail(path.empty() ? "configuration" : path, std::string("expected an object, got ") + typeName(object));
    }
    for (const auto& [key, value] : object.items()) {
        const std::string where = path.empty() ? key : path + "." + key;
        const auto field = fields.find(key);
        if (field == fields.end()) {
            std::string known;
            for (const auto& [name, unused] : fields) known += (known.empty() ? "" : ", ") + name;
            fail(where, "unknown key; known keys here: " + known);
        }
        field->second(value, where);
    }
}

}  // namespace

tl::expected<TrainerOptions, std::string> parseRunConfig(const json& config, TrainerOptions base) {
    TrainerOptions o = std::move(base);
    std::optional<int64_t> epochs;
    bool stepsGiven = false;  // a step limit in this configuration (not null, not 0)
    try {
        readObject(
            config, "",
            {
                {"model",
                 [&](const json& v, const std::string& p) {
                     readObject(v, p,
                                {
                                    {"name", [&](const json& x, const std::string& q) { o.model.name = text(x, q); }},
                                    {"norm",
                                     [&](const json& x, const std::string& q) {
                                         o.model.norm = parsed(parseNormKind(text(x, q)), q);
                                     }},
                                    {"width",
                                     [&](const json& x, const std::string& q) {
                                         o.model.width = integer(x, q, kMinModelWidth, kMaxModelWidth);
                                     }},
                                });
                 }},
                {"data",
                 [&](const json& v, const std::string& p) {
                     readObject(
                         v, p,
                         {
                             {"name", [&](const json& x, const std::string& q) { o.data.name = text(x, q); }},
                             {"samples",
                              [&](const json& x, const std::string& q) { o.data.samples = integer(x, q, 1); }},
                             {"classes",
                              [&](const json& x, const std::string& q) { o.data.classes = integer(x, q, 2); }},
                             {"seed",
                              [&](const json& x, const std::string& q) {
                                  o.data.seed = static_cast<uint64_t>(integer(x, q, 0));
                              }},
                             {"path", [&](const json& x, const std::string& q) { o.data.path = text(x, q); }},
                             {"target_column",
                              [&](const json& x, const std::string& q) { o.data.targetColumn = text(x, q); }},
                             {"regression",
                              [&](const json& x, const std::string& q) {
                                  if (!x.is_boolean())
                                      fail(q,
                                           std::string("expected true or false, got ") + typeName(x) + " " + shown(x));
                                  o.data.regression = x.get<bool>();
                              }},
                             {"image_size",
                              [&](const json& x, const std::string& q) {
                                  if (!x.is_array() || x.size() != 3)
                                      fail(q, "expected [channels, height, width], e.g. [3, 32, 32], got " + shown(x));
                                  o.data.channels = integer(x[0], q + "[0]", 1, kMaxChannels);
                                  o.data.height = integer(x[1], q + "[1]", 1, kMaxImageSide);
                                  o.data.width = integer(x[2], q + "[2]", 1, kMaxImageSide);
                              }},
                         });
                 }},
                {"device", [&](const json& v,
                               const std::string& p) { o.device = parsed(parseDeviceName(text(v, p)), p).name(); }},
                {"target_batch", [&](const json& v, const std::string& p) { o.targetBatch = integer(v, p, 1); }},
                {"probe",
                 [&](const json& v, const std::string& p) {
                     readObject(
                         v, p,
                         {
                             {"initial_micro_batch",
                              [&](const json& x, const std::string& q) {
                                  o.probe.initialMicroBatch = integer(x, q, 1);
                              }},
                             {"max_micro_batch",
                              [&](const json& x, const std::string& q) { o.probe.maxMicroBatch = integer(x, q, 0); }},
                             {"headroom",
                              [&](const json& x, const std::string& q) { o.probe.headroom = number(x, q, 0.0, 0.9); }},
                             {"multiple_of",
                              [&](const json& x, const std::string& q) { o.probe.multipleOf = integer(x, q, 1); }},
                             {"max_trials",
                              [&](const json& x, const std::string& q) {
                                  o.probe.maxTrials = static_cast<int>(integer(x, q, 1, kMaxProbeTrials));
                              }},
                             {"tolerance",
                              [&](const json& x, const std::string& q) { o.probe.tolerance = number(x, q, 0.0, 0.5); }},
                             {"objective",
                              [&](const json& x, const std::string& q) {
                                  o.probe.objective = parsed(parseProbeObjective(text(x, q)), q);
                              }},
                             {"retime_every",
                              [&](const json& x, const std::string& q) {
                                  o.probe.retimeEvery = integer(x, q, 0, kMaxRetimeEvery);
                              }},
                             {"retime_drift",
                              [&](const json& x, const std::string& q) {
                                  o.probe.retimeDrift = number(x, q, 0.01, 10.0);
                              }},
                         });
                 }},
                {"optimizer",
                 [&](const json& v, const std::string& p) {
                     readObject(
                         v, p,
                         {
                             {"kind",
                              [&](const json& x, const std::string& q) {
                                  o.optimizer.kind = parsed(parseOptimizerKind(text(x, q)), q);
                              }},
                             {"learning_rate",
                              [&](const json& x, const std::string& q) {
                                  o.optimizer.learningRate = number(x, q, 0.0, kMaxLearningRate);
                                  if (o.optimizer.learningRate <= 0) fail(q, "expected a positive number, got 0");
                              }},
                             {"momentum",
                              [&](const json& x, const std::string& q) {
                                  o.optimizer.momentum = number(x, q, 0.0, 1.0, true);
                              }},
                             {"weight_decay",
                              [&](const json& x, const std::string& q) {
                                  o.optimizer.weightDecay = number(x, q, 0.0, kMaxWeightDecay);
                              }},
                             {"beta1", [&](const json& x,
                                           const std::string& q) { o.optimizer.beta1 = number(x, q, 0.0, 1.0, true); }},
                             {"beta2", [&](const json& x,
                                           const std::string& q) { o.optimizer.beta2 = number(x, q, 0.0, 1.0, true); }},
                             {"epsilon", [&](const json& x,
                                             const std::string& q) { o.optimizer.epsilon = number(x, q, 0.0, 1.0); }},
                         });
                 }},
                // null: no limit; 0 (written by older versions): as if the key were absent.
                {"steps",
                 [&](const json& v, const std::string& p) {
                     if (v.is_null()) {
                         o.steps.reset();
                     } else if (const int64_t n = integer(v, p, 0, kMaxSteps); n > 0) {
                         o.steps = n;
                         stepsGiven = true;
                     }
                 }},
                {"epochs",
                 [&](const json& v, const std::string& p) {
                     if (v.is_null()) {
                         o.epochs.reset();
                     } else if (const int64_t n = integer(v, p, 0, kMaxEpochs); n > 0) {
                         epochs = n;
                     }
                 }},
                {"seed",
                 [&](const json& v, const std::string& p) { o.seed = static_cast<uint64_t>(integer(v, p, 0)); }},
                {"lr_scaling",
                 [&](const json& v, const std::string& p) { o.lrScaling = parsed(parseLrScaling(text(v, p)), p); }},
                {"loss", [&](const json& v, const std::string& p) { o.loss = parsed(parseLossKind(text(v, p)), p); }},
                {"memory_savers",
                 [&](const json& v, const std::string& p) {
                     o.memorySavers = parsed(parseMemorySavers(text(v, p)), p);
                 }},
                {"saver_threshold",
                 [&](const json& v, const std::string& p) { o.saverThreshold = integer(v, p, 0, kMaxTargetBatch); }},
                {"loss_scale",
                 [&](const json& v, const std::string& p) { o.lossScale = number(v, p, 1.0, kMaxLossScale); }},
                {"regrow_after_steps",
                 [&](const json& v, const std::string& p) {
                     o.regrowAfterSteps = static_cast<int>(integer(v, p, 0, kMaxRegrowAfterSteps));
                 }},
                {"threads",
                 [&](const json& v, const std::string& p) {
                     o.intraOpThreads = static_cast<int>(integer(v, p, 0, kMaxThreads));
                 }},
                {"cuda_memory_fraction",
                 [&](const json& v, const std::string& p) { o.cudaMemoryFraction = number(v, p, 0.0, 1.0); }},
                {"validation",
                 [&](const json& v, const std::string& p) {
                     readObject(
                         v, p,
                         {
                             // null: the default (a tenth held out).
                             {"split",
                              [&](const json& x, const std::string& q) {
                                  if (x.is_null())
                                      o.validation.split.reset();
                                  else
                                      o.validation.split = number(x, q, 0.0, 0.9);
                              }},
                             {"path", [&](const json& x, const std::string& q) { o.validation.path = text(x, q); }},
                             // null: at the end of every epoch.
                             {"every_steps",
                              [&](const json& x, const std::string& q) {
                                  if (x.is_null())
                                      o.validation.everySteps.reset();
                                  else
                                      o.validation.everySteps = integer(x, q, 1, kMaxSteps);
                              }},
                         });
                 }},
                {"checkpoint",
                 [&](const json& v, const std::string& p) {
                     readObject(
                         v, p,
                         {
                             {"directory",
                              [&](const json& x, const std::string& q) { o.checkpoint.directory = text(x, q); }},
                             {"every_steps",
                              [&](const json& x, const std::string& q) { o.checkpoint.everySteps = integer(x, q, 0); }},
                             {"keep_best",
                              [&](const json& x, const std::string& q) { o.checkpoint.keepBest = text(x, q); }},
                         });
                 }},
            });
    } catch (const ConfigError& e) {
        return tl::unexpected(e.message);
    }
    if (epochs) setEpochs(o, *epochs, stepsGiven);
    settle(o);
    if (auto ok = validate(o); !ok) return tl::unexpected(ok.error());
    return o;
}

namespace {

/// " (lines 2 and 5)": the lines of `text` on which "key" is followed by a colon; empty unless
/// there are at least two.
std::string linesHolding(const std::string& text, const std::string& key) {
    std::vector<int64_t> lines;
    const std::string quoted = "\"" + key + "\"";
    for (size_t at = text.find(quoted); at != std::string::npos; at = text.find(quoted, at + 1)) {
        const size_t after = text.find_first_not_of(" \t\r\n", at + quoted.size());
        if (after == std::string::npos || text[after] != ':') continue;
        lines.push_back(1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
    }
    if (lines.size() < 2) return {};
    std::string out = " (lines ";
    for (size_t i = 0; i < lines.size(); ++i) {
        if (i > 0) out += i + 1 == lines.size() ? " and " : ", ";
        out += std::to_string(lines[i]);
    }
    return out + ")";
}

}  // namespace

tl::expected<TrainerOptions, std::string> loadRunConfig(const std::string& path, TrainerOptions base) {
    const std::string named = "the configuration \"" + path + "\"";
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(status))
        return tl::unexpected("cannot read " + named + ": check that the file exists");
    // A folder, a FIFO or a device is never read: reading could fail late or block forever.
    if (!std::filesystem::is_regular_file(status)) {
        return tl::unexpected(named + " is not a regular file (" +
                              (std::filesystem::is_directory(status) ? std::string("a folder")
                                                                     : std::string("a FIFO, socket or device")) +
                              "); give the path of a .json file");
    }
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && size > kMaxConfigBytes) {
        return tl::unexpected(named + " is " + std::to_string(size) +
                              " bytes; a run configuration is a few KiB (at most " + std::to_string(kMaxConfigBytes) +
                              " bytes): is this the right file?");
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return tl::unexpected("cannot read " + named + ": check that it is readable");
    std::string content;
    content.resize(kMaxConfigBytes + 1);
    in.read(content.data(), static_cast<std::streamsize>(content.size()));
    if (in.bad()) return tl::unexpected("reading " + named + " failed");
    content.resize(static_cast<size_t>(in.gcount()));
    if (content.size() > kMaxConfigBytes) {
        return tl::unexpected(named + " is larger than " + std::to_string(kMaxConfigBytes) +
                              " bytes: is this the right file?");
    }
    json config;
    bool tooDeep = false;
    // A key given twice in one object: JSON readers disagree on which value counts (this one would
    // take the last), so neither is taken. Its path, as "probe.headroom".
    std::string twice;
    std::vector<std::set<std::string>> keys;  // of each open object or array, innermost last
    std::vector<std::string> outerKeys;       // the keys leading to it
    std::string lastKey;
    // Deeper values are dropped while parsing (the parser itself does not recurse), so nothing
    // later walks a structure deep enough to overflow the stack.
    const json::parser_callback_t reader = [&](int depth, json::parse_event_t event, json& parsed) {
        using Event = json::parse_event_t;
        if (event == Event::object_start || event == Event::array_start) {
            keys.emplace_back();
            outerKeys.push_back(lastKey);
            lastKey.clear();
        } else if ((event == Event::object_end || event == Event::array_end) && !keys.empty()) {
            keys.pop_back();
            outerKeys.pop_back();
        } else if (event == Event::key && parsed.is_string() && !keys.empty()) {
            lastKey = parsed.get<std::string>();
            if (!keys.back().insert(lastKey).second && twice.empty()) {
                for (const std::string& outer : outerKeys)
                    if (!outer.empty()) twice += outer + ".";
                twice += lastKey;
            }
        }
        if (depth > kMaxConfigDepth) tooDeep = true;
        return depth <= kMaxConfigDepth;
    };
    try {
        config = json::parse(content, reader, /*allow_exceptions=*/true, /*ignore_comments=*/true);
    } catch (const json::parse_error& e) {
        return tl::unexpected(named + " is not valid JSON: " + e.what());
    } catch (const json::exception& e) {
        // E.g. a number beyond the double range (1e400): found by fuzz/fuzz_run_config.
        return tl::unexpected(named + " cannot be read: " + e.what());
    }
    if (tooDeep) {
        return tl::unexpected(named + " nests values more than " + std::to_string(kMaxConfigDepth) +
                              " levels deep; a run configuration has at most 3");
    }
    if (!twice.empty()) {
        const std::string key = twice.substr(twice.rfind('.') + 1);
        return tl::unexpected(named + " gives \"" + twice + "\" twice" + linesHolding(content, key) +
                              ": keep the one you mean and delete the other");
    }
    auto options = parseRunConfig(config, std::move(base));
    if (!options) return tl::unexpected(named + ": " + options.error());
    return options;
}

json toRunConfig(const TrainerOptions& o) {
    return {
        {"model", {{"name", o.model.name}, {"norm", toString(o.model.norm)}, {"width", o.model.width}}},
        {"data",
         {{"name", o.data.name},
          {"samples", o.data.samples},
          {"classes", o.data.classes},
          {"seed", o.data.seed},
          {"image_size", {o.data.channels, o.data.height, o.data.width}},
          {"path", o.data.path},
          {"target_column", o.data.targetColumn},
          {"regression", o.data.regression}}},
        {"device", o.device},
        {"target_batch", o.targetBatch},
        {"probe",
         {{"initial_micro_batch", o.probe.initialMicroBatch},
          {"max_micro_batch", o.probe.maxMicroBatch},
          {"headroom", o.probe.headroom},
          {"multiple_of", o.probe.multipleOf},
          {"max_trials", o.probe.maxTrials},
          {"tolerance", o.probe.tolerance},
          {"objective", toString(o.probe.objective)},
          {"retime_every", o.probe.retimeEvery},
          {"retime_drift", o.probe.retimeDrift}}},
        {"optimizer",
         {{"kind", toString(o.optimizer.kind)},
          {"learning_rate", o.optimizer.learningRate},
          {"momentum", o.optimizer.momentum},
          {"weight_decay", o.optimizer.weightDecay},
          {"beta1", o.optimizer.beta1},
          {"beta2", o.optimizer.beta2},
          {"epsilon", o.optimizer.epsilon}}},
        {"steps", o.steps ? json(*o.steps) : json(nullptr)},
        {"epochs", o.epochs ? json(*o.epochs) : json(nullptr)},
        {"seed", o.seed},
        {"lr_scaling", toString(o.lrScaling)},
        {"loss", toString(o.loss)},
        {"memory_savers", toString(o.memorySavers)},
        {"saver_threshold", o.saverThreshold},
        {"loss_scale", o.lossScale},
        {"regrow_after_steps", o.regrowAfterSteps},
        {"threads", o.intraOpThreads},
        {"cuda_memory_fraction", o.cudaMemoryFraction},
        {"validation",
         {{"split", o.validation.split ? json(*o.validation.split) : json(nullptr)},
          {"path", o.validation.path},
          {"every_steps", o.validation.everySteps ? json(*o.validation.everySteps) : json(nullptr)}}},
        {"checkpoint",
         {{"directory", o.checkpoint.directory},
          {"every_steps", o.checkpoint.everySteps},
          {"keep_best", o.checkpoint.keepBest}}},
    };
}

tl::expected<void, std::string> saveRunConfig(const std::string& path, const TrainerOptions& options) {
    return replaceFileAtomically(path, jsonText(toRunConfig(options), 2) + "\n", "the configuration \"" + path + "\"");
}

std::string jsonText(const nlohmann::json& value, int indent) {
    return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace batchpilot::core
