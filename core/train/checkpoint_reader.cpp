#include "core/train/checkpoint_reader.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>
#include <utility>

#include "core/base/text_format.h"
#include "core/config/option_schema.h"
#include "core/events/events.h"
#include "core/nn/model.h"
#include "core/optim/optimizer.h"

namespace batchpilot::core {
namespace {

constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

/// A field that is missing, of another type or out of range: the message every such refusal gives.
std::string edited(const std::string& path, const std::string& problem) {
    return "checkpoint \"" + path + "\" holds a value no run writes (" + problem +
           "): the file was edited or damaged; resume from an intact checkpoint or start a new run";
}

std::string typeOf(const c10::IValue& value) {
    if (value.isInt()) return "an integer";
    if (value.isDouble()) return "a number";
    if (value.isString()) return "a string";
    if (value.isBool()) return "true or false";
    if (value.isTensor()) return "a tensor";
    if (value.isNone()) return "none";
    return value.tagKind();
}

std::string dtypeName(torch::ScalarType type) {
    switch (type) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    case torch::kLong: return "int64";
    case torch::kInt: return "int32";
    case torch::kShort: return "int16";
    case torch::kChar: return "int8";
    case torch::kByte: return "uint8";
    case torch::kBool: return "bool";
    default: return c10::toString(type);
    }
}

std::string shapeOf(const torch::Tensor& t) {
    std::ostringstream out;
    out << t.sizes();
    return out.str();
}

/// Reads the archive's fields one by one; the first problem is kept in `error`.
class FieldReader {
public:
    FieldReader(torch::serialize::InputArchive& archive, std::string path)
        : m_archive(archive), m_path(std::move(path)) {}

    bool ok() const { return m_error.empty(); }
    const std::string& error() const { return m_error; }
    void fail(const std::string& problem) {
        if (m_error.empty()) m_error = edited(m_path, problem);
    }
    void failWhole(const std::string& message) {
        if (m_error.empty()) m_error = message;
    }

    /// The field `key`, or none when it is absent and `optional`.
    std::optional<c10::IValue> field(const std::string& key, bool optional = false) {
        c10::IValue value;
        if (m_archive.try_read(key, value)) return value;
        if (!optional) fail(key + ": missing");
        return std::nullopt;
    }
    template <typename T>
    std::optional<T> typed(const std::string& key, bool optional = false) {
        auto value = field(key, optional);
        if (!value) return std::nullopt;
        if constexpr (std::is_same_v<T, int64_t>) {
            if (value->isInt()) return value->toInt();
            fail(key + ": expected an integer, got " + typeOf(*value));
        } else if constexpr (std::is_same_v<T, double>) {
            if (value->isDouble()) return value->toDouble();
            fail(key + ": expected a number, got " + typeOf(*value));
        } else {
            if (value->isString()) return value->toStringRef();
            fail(key + ": expected a string, got " + typeOf(*value));
        }
        return std::nullopt;
    }
    template <typename T>
    void into(const std::string& key, T& out, bool optional = false) {
        if (auto value = typed<T>(key, optional)) out = *value;
    }

    /// The number `prefix`count, one of `allowed` (checked before anything is made for it);
    /// -1 after a problem, which `wrong` words (the count and what was expected).
    int64_t count(const std::string& prefix, const std::vector<int64_t>& allowed,
                  const std::function<void(int64_t)>& wrong) {
        const auto n = typed<int64_t>(prefix + "count");
        if (!n) return -1;
        for (const int64_t a : allowed)
            if (*n == a) return *n;
        wrong(*n);
        return -1;
    }

    /// `count` tensors `prefix`0, `prefix`1, …, each dense, on the CPU, of `like[i]`'s dtype and
    /// shape (`shapeProblem` words another shape), and finite.
    std::vector<torch::Tensor> tensors(
        const std::string& prefix, int64_t count, const std::vector<torch::Tensor>& like,
        const std::vector<std::string>& names,
        const std::function<void(const std::string&, const std::string&)>& shapeProblem) {
        std::vector<torch::Tensor> out;
        for (int64_t i = 0; ok() && i < count; ++i) {
            const auto at = static_cast<size_t>(i);
            const std::string key = prefix + std::to_string(i);
            const std::string named = key + (at < names.size() ? " (" + names[at] + ")" : std::string());
            auto value = field(key);
            if (!value) break;
            if (!value->isTensor()) {
                fail(named + ": expected a tensor, got " + typeOf(*value));
                break;
            }
            torch::Tensor t = value->toTensor();
            const torch::Tensor& model = like[at];
            if (!t.defined() || t.layout() != torch::kStrided || !t.device().is_cpu()) {
                fail(named + ": expected a dense tensor on the CPU, as a run saves it");
            } else if (t.scalar_type() != model.scalar_type()) {
                fail(named + ": expected a " + dtypeName(model.scalar_type()) + " tensor, as the model's, got " +
                     dtypeName(t.scalar_type()));
            } else if (t.sizes() != model.sizes()) {
                shapeProblem(named, "has shape " + shapeOf(t) + ", the model's " + shapeOf(model));
            } else if (t.is_floating_point() && t.numel() > 0 && !torch::isfinite(t).all().item<bool>()) {
                fail(named + ": expected finite values, got NaN or infinity");
            }
            out.push_back(std::move(t));
        }
        return out;
    }

private:
    torch::serialize::InputArchive& m_archive;
    std::string m_path;
    std::string m_error;
};

}  // namespace

tl::expected<void, std::string> checkTrainerState(const TrainerState& s) {
    const auto option = [](const char* key, const nlohmann::json& value, const char* field) {
        return checkOptionNumber(*findOption(key), value, field);
    };
    if (auto ok = checkInteger(s.step, 0, kMaxSteps, "step"); !ok) return ok;
    if (auto ok = checkInteger(s.samplesSeen, 0, kUnbounded, "samples_seen"); !ok) return ok;
    if (auto ok = checkInteger(s.samplerEpoch, 0, kUnbounded, "sampler_epoch"); !ok) return ok;
    if (s.trainingSamples != -1) {
        if (auto ok = checkInteger(s.trainingSamples, 1, kUnbounded, "training_samples"); !ok)
            return tl::unexpected(ok.error() + " (or -1: not recorded)");
    }
    // The position counts samples of the training set: at its end, the next batch starts an epoch.
    const int64_t positions = s.trainingSamples >= 0 ? s.trainingSamples : kUnbounded;
    if (auto ok = checkInteger(s.samplerPosition, 0, positions, "sampler_position"); !ok) {
        return tl::unexpected(ok.error() + (s.trainingSamples >= 0 ? " (the training samples it records)" : ""));
    }
    if (auto ok = option("target_batch", s.targetBatch, "target_batch"); !ok) return ok;
    // 0: written before the first probe found a size; the resumed run probes.
    if (auto ok = checkInteger(s.microBatch, 0, kMaxTargetBatch, "micro_batch"); !ok) return ok;
    if (auto ok = option("optimizer.learning_rate", s.learningRate, "learning_rate"); !ok) return ok;
    if (s.lossScale != 0) {
        if (auto ok = option("loss_scale", s.lossScale, "loss_scale"); !ok)
            return tl::unexpected(ok.error() + " (or 0: not scaled)");
    }
    if (const auto& names = validationMetricNames();
        !s.bestMetric.empty() && std::find(names.begin(), names.end(), s.bestMetric) == names.end()) {
        std::string known;
        for (const std::string& name : names) known += (known.empty() ? "" : ", ") + name;
        return tl::unexpected("best_metric: expected a validation metric (" + known + ") or none, got " +
                              quoteForMessage(s.bestMetric));
    }
    if (!std::isnan(s.bestValue) && !std::isfinite(s.bestValue))
        return tl::unexpected("best_value: expected a finite number (or NaN: none yet), got " +
                              formatText("%g", s.bestValue));
    return {};
}

namespace {

/// The checkpoint's numbers and names into `c`; its optimizer kind (judged by the caller).
std::optional<int64_t> readScalars(FieldReader& read, CheckpointContents& c) {
    TrainerState& s = c.state;
    read.into("model_name", s.modelName);
    read.into("device", s.device);
    read.into("learning_rate", s.learningRate);
    const auto kind = read.typed<int64_t>("optimizer_kind");
    read.into("optimizer_steps", c.optimizerSteps);
    read.into("step", s.step);
    read.into("samples_seen", s.samplesSeen);
    read.into("sampler_epoch", s.samplerEpoch);
    read.into("sampler_position", s.samplerPosition);
    read.into("target_batch", s.targetBatch);
    read.into("micro_batch", s.microBatch);
    // Absent from checkpoints written before they were recorded: their defaults stand.
    read.into("training_samples", s.trainingSamples, /*optional=*/true);
    if (auto metric = read.typed<std::string>("best_metric", /*optional=*/true)) {
        s.bestMetric = *metric;
        read.into("best_value", s.bestValue);
    }
    read.into("loss_scale", s.lossScale, /*optional=*/true);
    read.into("data_fingerprint", s.dataFingerprint, /*optional=*/true);
    read.into("loss", s.loss, /*optional=*/true);
    if (auto seed = read.typed<int64_t>("seed", /*optional=*/true)) s.seed = static_cast<uint64_t>(*seed);
    return kind;
}

/// The model's parameters and buffers and the optimizer's state into `c`, each checked against
/// `model` (a failure is left in `read`).
void readTensors(FieldReader& read, const std::string& path, const Model& model, CheckpointContents& c) {
    const auto parameters = model.parameters();
    const auto buffers = model.buffers();
    const auto parameterCount = static_cast<int64_t>(parameters.size());
    const auto otherModel = [&](const std::string& what) {
        read.failWhole("checkpoint \"" + path + "\" does not match this model's parameters (" + what +
                       "; other width, input size or number of classes): use the same model options to resume");
    };
    const auto countOf = [&](const char* prefix, const std::vector<torch::Tensor>& tensors) {
        return read.count(prefix, {static_cast<int64_t>(tensors.size())}, [&](int64_t n) {
            otherModel(std::string(prefix) + "count is " + std::to_string(n) + ", this model has " +
                       std::to_string(tensors.size()));
        });
    };
    const auto stateCount = [&](const char* prefix) {
        return read.count(prefix, {0, parameterCount}, [&](int64_t n) {
            read.fail(std::string(prefix) + "count: expected 0 (no step yet) or " + std::to_string(parameterCount) +
                      " (one per parameter), got " + std::to_string(n));
        });
    };
    const auto sameModel = [&](const std::string& named, const std::string& how) { otherModel(named + " " + how); };
    const auto sameParameter = [&](const std::string& named, const std::string& how) {
        read.fail(named + ": expected the shape of its parameter, but it " + how);
    };
    const auto parameterNames = model.parameterNames();
    const auto bufferNames = model.bufferNames();
    c.parameters = read.tensors("parameter", countOf("parameter", parameters), parameters, parameterNames, sameModel);
    c.buffers = read.tensors("buffer", countOf("buffer", buffers), buffers, bufferNames, sameModel);
    c.first = read.tensors("first", stateCount("first"), parameters, parameterNames, sameParameter);
    c.second = read.tensors("second", stateCount("second"), parameters, parameterNames, sameParameter);
}

}  // namespace

tl::expected<CheckpointContents, std::string> readCheckpoint(torch::serialize::InputArchive& archive,
                                                             const std::string& path, const Model& model,
                                                             const Optimizer& optimizer) {
    FieldReader read(archive, path);
    CheckpointContents c;
    const TrainerState& s = c.state;
    if (const auto format = read.typed<int64_t>("format"); format && *format != kCheckpointFormat) {
        return tl::unexpected("checkpoint \"" + path + "\" has an unknown format version (" + std::to_string(*format) +
                              "); resume it with the BatchPilot that wrote it");
    }
    const auto kind = readScalars(read, c);
    if (!read.ok()) return tl::unexpected(read.error());

    // Another model or optimizer is the likeliest mistake: said before any value is judged.
    if (s.modelName != model.name()) {
        return tl::unexpected("checkpoint \"" + path + "\" was written for model " + quoteForMessage(s.modelName) +
                              ", but this run builds \"" + model.name() + "\": use the same model to resume");
    }
    if (auto known = checkInteger(*kind, 0, static_cast<int64_t>(OptimizerKind::AdamW), "optimizer_kind"); !known)
        return tl::unexpected(edited(path, known.error()));
    if (*kind != static_cast<int64_t>(optimizer.kind())) {
        return tl::unexpected("checkpoint \"" + path + "\" was written with the " +
                              toString(static_cast<OptimizerKind>(*kind)) + " optimizer, but this run uses " +
                              toString(optimizer.kind()) + ": use the same optimizer to resume");
    }
    if (auto ok = checkTrainerState(s); !ok) return tl::unexpected(edited(path, ok.error()));
    if (auto ok = checkInteger(c.optimizerSteps, 0, kMaxSteps, "optimizer_steps"); !ok)
        return tl::unexpected(edited(path, ok.error()));

    readTensors(read, path, model, c);
    if (!read.ok()) return tl::unexpected(read.error());
    if (auto ok = optimizer.checkState(c.first, c.second, c.optimizerSteps); !ok)
        return tl::unexpected(edited(path, ok.error()));
    return c;
}

}  // namespace batchpilot::core
