#include "core/config/run_config.h"

#include <algorithm>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/config/option_schema.h"
#include "core/base/durable_file.h"

namespace batchpilot::core {
namespace {

using nlohmann::json;

/// A run configuration is a few KiB; a larger file is not one (and is never echoed in full).
constexpr size_t kMaxConfigBytes = kMaxRunConfigBytes;
/// Deeper nesting is refused while parsing (the configuration's own depth is 3).
constexpr int kMaxConfigDepth = 32;

/// Whether `path` ("probe") holds options of its own ("probe.headroom").
bool isSection(const std::string& path) {
    const std::string prefix = path + ".";
    const auto& schema = optionSchema();
    return std::any_of(schema.begin(), schema.end(), [&](const OptionSpec& s) { return s.key.starts_with(prefix); });
}

/// The keys directly inside `path` ("" for the top level), sorted: for a message.
std::string keysInside(const std::string& path) {
    std::set<std::string> keys;
    const std::string prefix = path.empty() ? "" : path + ".";
    for (const OptionSpec& s : optionSchema()) {
        if (!s.key.starts_with(prefix)) continue;
        const std::string rest = s.key.substr(prefix.size());
        keys.insert(rest.substr(0, rest.find('.')));
    }
    std::string known;
    for (const std::string& key : keys) known += (known.empty() ? "" : ", ") + key;
    return known;
}

/// Reads every member of `object`, the section at `path`: each is an option of the schema
/// (core/config/option_schema.h) or a section holding some.
tl::expected<void, std::string> readSection(const json& object, const std::string& path, TrainerOptions& o,
                                            OptionReading& reading) {
    if (!object.is_object()) {
        return tl::unexpected((path.empty() ? std::string("configuration") : path) + ": expected an object, got " +
                              jsonTypeName(object));
    }
    for (const auto& [key, value] : object.items()) {
        const std::string where = path.empty() ? key : path + "." + key;
        // "probe.headroom" as one key would be a second way to give probe's headroom.
        if (key.find('.') != std::string::npos) {
            return tl::unexpected(where + ": unknown key (a section's keys go inside it: {\"" +
                                  key.substr(0, key.find('.')) + "\": {\"" + key.substr(key.find('.') + 1) +
                                  "\": …}})");
        }
        if (const OptionSpec* spec = findOption(where)) {
            if (auto ok = readOption(*spec, value, where, o, reading); !ok) return ok;
        } else if (isSection(where)) {
            if (auto ok = readSection(value, where, o, reading); !ok) return ok;
        } else {
            return tl::unexpected(where + ": unknown key; known keys here: " + keysInside(path));
        }
    }
    return {};
}

}  // namespace

tl::expected<TrainerOptions, std::string> parseRunConfig(const json& config, TrainerOptions base) {
    TrainerOptions o = std::move(base);
    OptionReading reading;
    if (auto ok = readSection(config, "", o, reading); !ok) return tl::unexpected(ok.error());
    finishReading(o, reading);
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
        const int64_t line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
        if (lines.empty() || lines.back() != line) lines.push_back(line);  // twice on one line: no lines to name
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

tl::expected<json, std::string> parseJsonText(const std::string& content, const std::string& named) {
    // nlohmann::json stops at a NUL byte as at the end of the text: "{}\0junk" would read as {}.
    if (const size_t nul = content.find('\0'); nul != std::string::npos)
        return tl::unexpected(named + " holds a NUL byte (at byte " + std::to_string(nul) +
                              "): JSON text has none; is this the right file?");
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
    return config;
}

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
    return readRunConfigText(content, named, std::move(base));
}

tl::expected<TrainerOptions, std::string> readRunConfigText(std::string_view content, const std::string& named,
                                                            TrainerOptions base) {
    if (content.size() > kMaxConfigBytes) {
        return tl::unexpected(named + " is " + std::to_string(content.size()) +
                              " bytes; a run configuration is a few KiB (at most " + std::to_string(kMaxConfigBytes) +
                              " bytes)");
    }
    auto config = parseJsonText(std::string(content), named);
    if (!config) return tl::unexpected(config.error());
    auto options = parseRunConfig(*config, std::move(base));
    if (!options) return tl::unexpected(named + ": " + options.error());
    return options;
}

json toRunConfig(const TrainerOptions& o) {
    json config = json::object();
    for (const OptionSpec& spec : optionSchema()) {
        std::string pointer = "/" + spec.key;
        std::replace(pointer.begin(), pointer.end(), '.', '/');
        config[json::json_pointer(pointer)] = spec.get(o);
    }
    return config;
}

tl::expected<void, std::string> saveRunConfig(const std::string& path, const TrainerOptions& options) {
    return replaceFileAtomically(path, jsonText(toRunConfig(options), 2) + "\n", "the configuration \"" + path + "\"");
}

const char* jsonTypeName(const nlohmann::json& value) {
    if (value.is_boolean()) return "a boolean";
    if (value.is_number_integer() || value.is_number_unsigned()) return "an integer";
    if (value.is_number()) return "a number";
    if (value.is_string()) return "a string";
    if (value.is_array()) return "an array";
    if (value.is_object()) return "an object";
    return "null";
}

std::string jsonText(const nlohmann::json& value, int indent) {
    return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace batchpilot::core
