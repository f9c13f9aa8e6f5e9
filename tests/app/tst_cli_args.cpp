#include <QtTest>

#include <QTemporaryDir>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>
#include <cctype>
#include <string>
#include <vector>

#include "app/cli_args.h"
#include "core/config/option_schema.h"
#include "core/config/run_config.h"

// Each option is declared once (core/config/option_schema.cpp) and read by three front ends: the
// command line's flags, the configuration file and check() (which the window's run panel and the
// trainer call). These tests hold each front end to the range the schema states, value by value at
// its edges, so that a front end that drifts (a flag with its own limit, a reader with a missing
// maximum) fails here; and every configuration key round-trips through the writer.

namespace {

using namespace batchpilot;
using nlohmann::json;

/// The flags every command line below starts with: a run that resolves on any machine.
std::vector<std::string> base() {
    return {"--device", "virtual:64MiB", "--model", "mlp"};
}

/// The value `spec` takes on the command line, as text that means exactly `value`.
std::string asText(const core::OptionSpec& spec, const json& value) {
    if (spec.type == core::OptionType::Integer) return std::to_string(value.get<int64_t>());
    std::ostringstream out;
    out << std::setprecision(17) << value.get<double>();
    return out.str();
}

struct Edge {
    json value;
    bool valid;
};

/// The values at the edges of an Integer or Number option's range: the ends (valid) and the values
/// just outside them (invalid). An open end is itself outside.
std::vector<Edge> edges(const core::OptionSpec& spec) {
    std::vector<Edge> out;
    if (spec.type == core::OptionType::Integer) {
        out.push_back({json(spec.minimum), true});
        if (spec.minimum > std::numeric_limits<int64_t>::min()) out.push_back({json(spec.minimum - 1), false});
        out.push_back({json(spec.maximum), true});
        if (spec.maximum < std::numeric_limits<int64_t>::max()) out.push_back({json(spec.maximum + 1), false});
        return out;
    }
    // Inside an open end by a billionth of the range (the next double after 0 is a denormal, which
    // no one types); outside a closed end by the next double.
    const double inf = std::numeric_limits<double>::infinity();
    const double step = (spec.high - spec.low) * 1e-9;
    out.push_back({json(spec.lowOpen ? spec.low + step : spec.low), true});
    out.push_back({json(spec.lowOpen ? spec.low : std::nextafter(spec.low, -inf)), false});
    out.push_back({json(spec.highOpen ? spec.high - step : spec.high), true});
    out.push_back({json(spec.highOpen ? spec.high : std::nextafter(spec.high, inf)), false});
    return out;
}

/// {"probe": {"headroom": value}} for "probe.headroom".
json configWith(const std::string& key, const json& value) {
    json config = json::object();
    std::string pointer = "/" + key;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    config[json::json_pointer(pointer)] = value;
    return config;
}

/// Other options an edge value needs to resolve (a CUDA cap needs a CUDA device, which this
/// machine may lack: its edges are checked by the readers, not by resolve()).
bool resolvesAnywhere(const core::OptionSpec& spec) {
    return spec.key != "cuda_memory_fraction";
}

}  // namespace

class TestCliArgs : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void schemaIsConsistent() {
        std::set<std::string> keys, flags;
        for (const core::OptionSpec& spec : core::optionSchema()) {
            QVERIFY2(keys.insert(spec.key).second, spec.key.c_str());
            if (!spec.flag.empty()) QVERIFY2(flags.insert(spec.flag).second, spec.flag.c_str());
            QVERIFY2(!spec.group.empty() && !spec.label.empty(), spec.key.c_str());
            QVERIFY2(spec.flag.empty() || !spec.help.empty(), spec.key.c_str());
            // The default itself is inside the range (or null where null means something).
            core::TrainerOptions o;
            core::OptionReading reading;
            auto read = core::readOption(spec, core::optionDefault(spec), spec.key, o, reading);
            QVERIFY2(read.has_value(), read ? "" : read.error().c_str());
        }
        // Every flag of the schema is in --help, under its own name.
        const std::string help = app::cliHelp();
        for (const std::string& flag : flags) QVERIFY2(help.find(flag + " ") != std::string::npos, flag.c_str());
    }

    /// At each end of each range, the flag, the configuration and check() agree: the end is taken
    /// (and reaches the options as given), one step outside is refused, each naming the option.
    void everyFrontEndKeepsTheSameRange() {
        int checked = 0;
        for (const core::OptionSpec& spec : core::optionSchema()) {
            if (spec.type != core::OptionType::Integer && spec.type != core::OptionType::Number) continue;
            for (const Edge& edge : edges(spec)) {
                const std::string what =
                    spec.key + " = " + edge.value.dump() + (edge.valid ? " (valid)" : " (invalid)");
                // The configuration file.
                const auto read = core::parseRunConfig(configWith(spec.key, edge.value));
                if (spec.zeroIsAbsent && edge.value == json(0)) {
                    // Older versions wrote 0 for "not set": read as if the key were absent.
                    QVERIFY2(read.has_value(), what.c_str());
                    QCOMPARE(spec.get(*read), core::optionDefault(spec));
                } else if (edge.valid) {
                    QVERIFY2(read.has_value(), (what + ": " + (read ? "" : read.error())).c_str());
                    QCOMPARE(spec.get(*read), edge.value);
                } else {
                    QVERIFY2(!read.has_value(), what.c_str());
                    QVERIFY2(read.error().rfind(spec.key, 0) == 0, (what + ": " + read.error()).c_str());
                }
                // Another file that carries the value (a checkpoint's target batch): the
                // configuration's words, and its verdict.
                if (!(spec.zeroIsAbsent && edge.value == json(0))) {
                    const auto carried = core::checkOptionNumber(spec, edge.value, spec.key);
                    QCOMPARE(carried.has_value(), edge.valid);
                    if (!edge.valid) QCOMPARE(carried.error(), read.error());
                }
                // check(), on options set past the readers (as the window and tests set them).
                core::TrainerOptions direct;
                core::OptionReading reading;
                spec.set(direct, edge.value, reading);
                core::finishReading(direct, reading);
                const auto checked_ = core::check(direct);
                if (edge.valid) {
                    QVERIFY2(checked_.has_value(), (what + ": " + (checked_ ? "" : checked_.error().message)).c_str());
                } else {
                    QVERIFY2(!checked_.has_value(), what.c_str());
                    QCOMPARE(checked_.error().field, spec.key);
                }
                // The command line.
                if (spec.flag.empty()) continue;
                auto args = base();
                args.push_back(spec.flag);
                args.push_back(asText(spec, edge.value));
                const auto parsed = app::parseCli(args);
                if (edge.valid && resolvesAnywhere(spec)) {
                    QVERIFY2(parsed.has_value(), (what + ": " + (parsed ? "" : parsed.error())).c_str());
                    QCOMPARE(spec.get(parsed->options), edge.value);
                } else if (!edge.valid) {
                    QVERIFY2(!parsed.has_value(), what.c_str());
                    QVERIFY2(parsed.error().rfind(spec.flag + ": ", 0) == 0, (what + ": " + parsed.error()).c_str());
                }
                ++checked;
            }
        }
        QVERIFY2(checked >= 100, std::to_string(checked).c_str());
    }

    /// Every name of every choice is taken by the flag and the configuration alike, and an unknown
    /// name is refused by both.
    void everyChoiceOnEveryFrontEnd() {
        for (const core::OptionSpec& spec : core::optionSchema()) {
            if (spec.type != core::OptionType::Choice) continue;
            QVERIFY2(spec.choices.size() >= 2, spec.key.c_str());
            for (const std::string& name : spec.choices) {
                const auto read = core::parseRunConfig(configWith(spec.key, name));
                QVERIFY2(read.has_value(), (spec.key + " " + name + ": " + (read ? "" : read.error())).c_str());
                QCOMPARE(spec.get(*read), json(name));
                if (spec.flag.empty() || spec.key == "data.name") continue;  // a data set needs its files
                auto args = base();
                args.push_back(spec.flag);
                args.push_back(name);
                const auto parsed = app::parseCli(args);
                QVERIFY2(parsed.has_value(), (spec.flag + " " + name + ": " + (parsed ? "" : parsed.error())).c_str());
                QCOMPARE(spec.get(parsed->options), json(name));
            }
            QVERIFY(!core::parseRunConfig(configWith(spec.key, "no-such-name")).has_value());
            // One spelling: "FP16" is refused with the name to write, on every front end.
            std::string upper = spec.choices.back();
            for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
            const auto shouted = core::parseRunConfig(configWith(spec.key, upper));
            QVERIFY2(!shouted.has_value(), (spec.key + " " + upper).c_str());
            QVERIFY2(shouted.error().find("lower case (\"" + spec.choices.back() + "\")") != std::string::npos,
                     shouted.error().c_str());
            if (!spec.flag.empty()) {
                auto args = base();
                args.push_back(spec.flag);
                args.push_back(upper);
                QVERIFY2(!app::parseCli(args).has_value(), (spec.flag + " " + upper).c_str());
            }
            if (!spec.flag.empty()) {
                auto args = base();
                args.push_back(spec.flag);
                args.push_back("no-such-name");
                QVERIFY2(!app::parseCli(args).has_value(), spec.flag.c_str());
            }
        }
    }

    /// A configuration written from the options holds every key of the schema and nothing else,
    /// and reads back to the same options.
    void writerHoldsEveryKey() {
        core::TrainerOptions o;
        const json written = core::toRunConfig(o);
        const json flat = written.flatten();
        std::set<std::string> keys;
        for (const auto& [pointer, value] : flat.items()) {
            std::string key = pointer.substr(1);
            // image_size is one array-valued option: "/data/image_size/0" → data.image_size
            if (const auto digit = key.find_last_of('/'); std::isdigit(static_cast<unsigned char>(key[digit + 1])))
                key.erase(digit);
            std::replace(key.begin(), key.end(), '/', '.');
            keys.insert(key);
        }
        std::set<std::string> schema;
        for (const core::OptionSpec& spec : core::optionSchema()) schema.insert(spec.key);
        QCOMPARE(keys, schema);
        const auto again = core::parseRunConfig(written);
        QVERIFY(again.has_value());
        QCOMPARE(core::toRunConfig(*again), written);
    }

    /// A flag given with a configuration overrides it; the flags' epochs drop the default steps
    /// only when the flags give no steps (the same rule as inside one configuration).
    void flagsOverrideAndEpochsFollowTheirSource() {
        QTemporaryDir dir;
        const std::string config = dir.filePath(QStringLiteral("run.json")).toStdString();
        QVERIFY(core::saveRunConfig(config, *core::parseRunConfig(json::parse(R"({"steps": 7, "target_batch": 32,
                                                                                "device": "virtual:64MiB",
                                                                                "model": {"name": "mlp"}})")))
                    .has_value());
        auto fromFile = app::parseCli({"--config", config, "--target-batch", "64"});
        QVERIFY2(fromFile.has_value(), fromFile ? "" : fromFile.error().c_str());
        QCOMPARE(fromFile->options.targetBatch, int64_t{64});          // the flag
        QCOMPARE(fromFile->options.steps, std::optional<int64_t>(7));  // the file
        auto parsed = app::parseCli({"--device", "virtual:64MiB", "--model", "mlp", "--epochs", "3"});
        QVERIFY(parsed.has_value());
        QCOMPARE(parsed->options.epochs, std::optional<int64_t>(3));
        QVERIFY(!parsed->options.steps.has_value());
        parsed = app::parseCli({"--epochs", "3", "--steps", "7", "--device", "virtual:64MiB", "--model", "mlp"});
        QVERIFY(parsed.has_value());
        QCOMPARE(parsed->options.steps, std::optional<int64_t>(7));
        QCOMPARE(parsed->options.epochs, std::optional<int64_t>(3));
        // "010" is ten, not octal eight.
        parsed = app::parseCli({"--device", "virtual:64MiB", "--model", "mlp", "--steps", "010"});
        QVERIFY(parsed.has_value());
        QCOMPARE(parsed->options.steps, std::optional<int64_t>(10));
        parsed = app::parseCli({"--device", "virtual:64MiB", "--model", "mlp", "--equal-shares"});
        QVERIFY(parsed.has_value());
        QVERIFY(!parsed->options.balanceShares);
        parsed = app::parseCli({"--device", "virtual:64MiB", "--model", "mlp", "--equal-shares=false"});
        QVERIFY(parsed.has_value());
        QVERIFY(parsed->options.balanceShares);
    }

    /// An optimizer named without a learning rate gets its own: PyTorch's 0.001 for Adam and
    /// AdamW (SGD's 0.05 made Adam diverge within two steps); a rate given, on the command line or
    /// in the configuration under it, is kept.
    void eachOptimizerBringsItsLearningRate() {
        const auto rate = [](std::vector<std::string> args) {
            for (const char* a : {"--device", "virtual:64MiB", "--model", "mlp"}) args.emplace_back(a);
            auto parsed = app::parseCli(args);
            return parsed ? parsed->options.optimizer.learningRate : -1.0;
        };
        QCOMPARE(rate({}), 0.05);
        QCOMPARE(rate({"--optimizer", "sgd"}), 0.05);
        QCOMPARE(rate({"--optimizer", "adam"}), 0.001);
        QCOMPARE(rate({"--optimizer", "adamw"}), 0.001);
        QCOMPARE(rate({"--optimizer", "adam", "--lr", "0.05"}), 0.05);
        QCOMPARE(rate({"--lr", "0.02", "--optimizer", "adamw"}), 0.02);
        QTemporaryDir dir;
        const auto config = [&](const char* name, const char* text) {
            const std::string path = dir.filePath(QString::fromLatin1(name)).toStdString();
            QFile file(QString::fromStdString(path));
            if (!file.open(QIODevice::WriteOnly)) return std::string();
            file.write(text);
            return path;
        };
        const std::string adam = config("adam.json", R"({"optimizer": {"kind": "adam"}})");
        const std::string chosen = config("chosen.json", R"({"optimizer": {"kind": "adam", "learning_rate": 0.01}})");
        QCOMPARE(rate({"--config", adam}), 0.001);
        QCOMPARE(rate({"--config", adam, "--optimizer", "sgd"}), 0.05);  // the flag's optimizer, its rate
        QCOMPARE(rate({"--config", chosen}), 0.01);
        QCOMPARE(rate({"--config", chosen, "--optimizer", "adamw"}), 0.01);  // a chosen rate stays
        QCOMPARE(core::parseRunConfig(json::parse(R"({"optimizer": {"kind": "adamw"}})"))->optimizer.learningRate,
                 0.001);
    }

    /// Whole numbers as written, or refused: no sign but "-", no spaces, no zeros hiding a
    /// second number, nothing beyond the 64-bit range taken for its remainder.
    void wholeNumbersAreReadAsWritten() {
        for (const char* text : {"0-0", "00-5", "+5", " 5", "5 ", "0x10", "1e3", ""}) {
            const auto parsed = app::parseCli({"--device", "virtual:64MiB", "--model", "mlp", "--seed", text});
            QVERIFY2(!parsed.has_value(), text);
        }
        const auto huge = app::parseCli({"--seed", "99999999999999999999"});
        QVERIFY(!huge.has_value());
        QVERIFY2(huge.error().find("--seed: expects a whole number at least 0") == 0, huge.error().c_str());
        const auto zeros = app::parseCli({"--device", "virtual:64MiB", "--model", "mlp", "--seed", "-0"});
        QVERIFY(zeros.has_value());
        QCOMPARE(zeros->options.seed, uint64_t{0});
    }
};

QTEST_GUILESS_MAIN(TestCliArgs)
#include "tst_cli_args.moc"
