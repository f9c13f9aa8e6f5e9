#include "core/events/event_json.h"

#include <array>
#include <cmath>
#include <concepts>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "core/events/event_limits.h"

namespace batchpilot::core {
namespace {

using nlohmann::json;

// Each event type's fields are listed once, in describe(): the writer (toJson) and the reader
// (eventFromJson) walk the same list, so a field cannot be written under one key and read under
// another, or written and never read. A visitor `v` is called as
//   v("key", member)                       always written; read when present
//   v.unless(condition, "key", member)     written unless `condition` (a field that does not apply)
// Every field is optional when read: an absent one keeps its default (events files written
// before the field existed), so only "type" is required. A number's or a list's limits follow it
// (`v("step", e.step, kStep)`): the reader refuses a value beyond them, so that no view spends
// time or memory in proportion to what a damaged or hand-edited file claims.

template <class E, class T>
concept Is = std::same_as<std::remove_const_t<E>, T>;

/// The values a whole number of an event can take (each element's, for a list of numbers).
struct Within {
    int64_t least;
    int64_t most;
    const char* what;
};
/// The items a list of an event can hold.
struct AtMost {
    size_t items;
    const char* what;
};
constexpr Within kStep{0, kMaxEventSteps, "an optimizer step"};
constexpr Within kSamples{0, kMaxEventSamples, "a number of samples"};
constexpr Within kRank{0, kMaxEventRanks - 1, "a rank"};
constexpr Within kTrial{0, kMaxEventTrials, "a probe's trial count"};
constexpr AtMost kRanks{static_cast<size_t>(kMaxEventRanks), "ranks"};

template <class V>
void describe(V& v, Is<RunStateChanged> auto& e) {
    v("time", e.time);
    v("state", e.state);
    v("detail", e.detail);
}
template <class V>
void describe(V& v, Is<ProbeStarted> auto& e) {
    v("time", e.time);
    v("sequence", e.sequence);
    v("reason", e.reason);
    v("device", e.device);
    v("upper_bound", e.upperBound, kSamples);
    v("usable_bytes", e.usableBytes);
    v("reserved_bytes", e.reservedBytes);
}
template <class V>
void describe(V& v, Is<ProbeTrial> auto& e) {
    v("time", e.time);
    v("sequence", e.sequence);
    v("trial", e.trial, kTrial);
    v("micro_batch", e.microBatch, kSamples);
    v("fit", e.fit);
    v("within_headroom", e.withinHeadroom);
    v("peak_bytes", e.peakBytes);
    v("failed_allocation_bytes", e.failedAllocationBytes);
    v("seconds", e.seconds);
}
template <class V>
void describe(V& v, Is<ProbeFinished> auto& e) {
    v("time", e.time);
    v("sequence", e.sequence);
    v("micro_batch", e.microBatch, kSamples);
    v("accumulation_steps", e.accumulationSteps, kSamples);
    v("target_batch", e.targetBatch, kSamples);
    v("trials", e.trials, kTrial);
    v("seconds", e.seconds);
    v("hit_trial_limit", e.hitTrialLimit);
    v("fixed_bytes", e.fixedBytes);
    v("bytes_per_sample", e.bytesPerSample);
}
template <class V>
void describe(V& v, Is<OomEvent> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("phase", e.phase);
    v("micro_batch", e.microBatch, kSamples);
    v("requested_bytes", e.requestedBytes);
    v("message", e.message);
    v("recovered", e.recovered);
    v("new_micro_batch", e.newMicroBatch, kSamples);
    v("redone_samples", e.redoneSamples, kSamples);
    v.unless(e.snapshotFile.empty(), "snapshot_file", e.snapshotFile);
}
template <class V>
void describe(V& v, Is<MemorySample> auto& e) {
    v("time", e.time);
    v("allocated_bytes", e.allocatedBytes);
    v("reserved_bytes", e.reservedBytes);
    v("peak_bytes", e.peakBytes);
    v("capacity_bytes", e.capacityBytes);
    v("headroom_bytes", e.headroomBytes);
}
template <class V>
void describe(V& v, Is<StepMetrics> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("epoch", e.epoch);
    v("samples_seen", e.samplesSeen);
    v("loss", e.loss);
    v("micro_batch", e.microBatch, kSamples);
    v("accumulation_steps", e.accumulationSteps, kSamples);
    v("target_batch", e.targetBatch, kSamples);
    v("learning_rate", e.learningRate);
    v("samples_per_second", e.samplesPerSecond);
    v("step_seconds", e.stepSeconds);
    v("peak_bytes", e.peakBytes);
    v("total_steps", e.totalSteps);
}
template <class V>
void describe(V& v, Is<MicroBatchDone> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("index", e.index, kSamples);
    v("offset", e.offset, kSamples);
    v("size", e.size, kSamples);
    v("target_batch", e.targetBatch, kSamples);
    v("loss_weight", e.lossWeight);
    v("loss", e.loss);
    v("probe_trial", e.probeTrial);
    v.unless(e.sampleIndices.empty(), "sample_indices", e.sampleIndices);
    v.unless(!(e.gradientNorm > 0), "gradient_norm", e.gradientNorm);
}
template <class V>
void describe(V& v, Is<OptimizerStepped> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("micro_batches", e.microBatches, kSamples);
}
template <class V>
void describe(V& v, Is<TargetBatchChanged> auto& e) {
    v("time", e.time);
    v("old_target", e.oldTarget, kSamples);
    v("new_target", e.newTarget, kSamples);
    v("old_learning_rate", e.oldLearningRate);
    v("new_learning_rate", e.newLearningRate);
}
template <class V>
void describe(V& v, Is<DeviceSwitched> auto& e) {
    v("time", e.time);
    v("from", e.from);
    v("to", e.to);
    v("rank", e.rank, kRank);
}
template <class V>
void describe(V& v, Is<Warning> auto& e) {
    v("time", e.time);
    v("message", e.message);
}
template <class V>
void describe(V& v, Is<CheckpointSaved> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("path", e.path);
    v.unless(e.metric.empty(), "metric", e.metric);
    v.unless(e.metric.empty(), "value", e.value);
}
template <class V>
void describe(V& v, Is<ErrorEvent> auto& e) {
    v("time", e.time);
    v("message", e.message);
    v("where", e.where);
}
template <class V>
void describe(V& v, Is<RunSummary> auto& e) {
    v("time", e.time);
    v("device", e.device);
    v("model", e.model);
    v("parameter_count", e.parameterCount);
    v("parameter_tensors", e.parameterTensors);
    v("dataset", e.dataset);
    v("dataset_size", e.datasetSize);
    v("input_shape", e.inputShape);
    v("optimizer", e.optimizer);
    v("loss", e.loss);
    v("target_batch", e.targetBatch, kSamples);
    v("batch_statistics", e.batchStatistics);
}
template <class V>
void describe(V& v, Is<MemoryBreakdown> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("device", e.device);
    v("total_bytes", e.totalBytes);
    v("capacity_bytes", e.capacityBytes);
    v("usable_bytes", e.usableBytes);
    v("parameter_bytes", e.parameterBytes);
    v("gradient_bytes", e.gradientBytes);
    v("optimizer_state_bytes", e.optimizerStateBytes);
    v("optimizer_state_reserved", e.optimizerStateReserved);
    v("activation_bytes", e.activationBytes);
    v("activation_micro_batch", e.activationMicroBatch, kSamples);
    v("input_bytes", e.inputBytes);
    v("buffer_copy_bytes", e.bufferCopyBytes);
    v("largest_gradient_bytes", e.largestGradientBytes);
    v("resident_bytes", e.residentBytes);
    v("peak_bytes", e.peakBytes);
    v("cache_bytes", e.cacheBytes);
    v("other_process_bytes", e.otherProcessBytes);
    v("context_bytes", e.contextBytes);
    v("workspace_bytes", e.workspaceBytes);
    v("free_bytes", e.freeBytes);
    v.savers("memory_savers", e.memorySavers);  // none is written "off"
}
template <class V>
void describe(V& v, Is<StepModeWaiting> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("index", e.index, kSamples);
    v("offset", e.offset, kSamples);
    v("size", e.size, kSamples);
    v("target_batch", e.targetBatch, kSamples);
    v("probe_trial", e.probeTrial);
}
template <class V>
void describe(V& v, Is<ThroughputTimed> auto& e) {
    v("time", e.time);
    v("sequence", e.sequence);
    v("micro_batch", e.microBatch, kSamples);
    v("samples_per_second", e.samplesPerSecond);
    v("repetitions", e.repetitions);
}
template <class V>
void describe(V& v, Is<ThroughputChecked> auto& e) {
    v("time", e.time);
    v("sequence", e.sequence);
    v("micro_batch", e.microBatch, kSamples);
    v("largest_micro_batch", e.largestMicroBatch, kSamples);
    v("turn", e.turn);
    v("ratio", e.ratio);
    v("gain", e.gain);
    v("gain_low", e.gainLow);
    v("gain_high", e.gainHigh);
}
template <class V>
void describe(V& v, Is<ThroughputChosen> auto& e) {
    v("time", e.time);
    v("sequence", e.sequence);
    v("micro_batch", e.microBatch, kSamples);
    v("largest_micro_batch", e.largestMicroBatch, kSamples);
    v("accumulation_steps", e.accumulationSteps, kSamples);
    v("target_batch", e.targetBatch, kSamples);
    v("samples_per_second", e.samplesPerSecond);
    v("largest_samples_per_second", e.largestSamplesPerSecond);
    v("speed_over_largest", e.speedOverLargest);
    v("step_speed_over_largest", e.stepSpeedOverLargest);
    v("step_seconds", e.stepSeconds);
    v("micro_batch_seconds", e.microBatchSeconds);
    v("micro_batches_timed", e.microBatchesTimed);
    v("seconds", e.seconds);
    v.unless(e.batchRatios.empty(), "batch_ratios", e.batchRatios);
    v.unless(e.batchRatios.empty(), "batch_gain_low", e.batchGainLow);
    v.unless(e.batchRatios.empty(), "batch_gain_high", e.batchGainHigh);
    v.unless(e.batchRatios.empty(), "check_seconds", e.checkSeconds);
    v("reason", e.reason);
}
template <class V>
void describe(V& v, Is<ValidationDone> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("epoch", e.epoch);
    v("samples_seen", e.samplesSeen);
    v("samples", e.samples);
    v("loss", e.loss);
    v("micro_batch", e.microBatch, kSamples);
    v("ooms", e.ooms);
    v("seconds", e.seconds);
    // Metrics that do not apply to the data are left out rather than written as -1.
    v.unless(e.accuracy < 0, "accuracy", e.accuracy);
    v.unless(e.top5Accuracy < 0, "top5_accuracy", e.top5Accuracy);
    v.unless(e.meanSquaredError < 0, "mse", e.meanSquaredError);
    v.unless(e.meanAbsoluteError < 0, "mae", e.meanAbsoluteError);
}
template <class V>
void describe(V& v, Is<RankStep> auto& r) {
    v("rank", r.rank, kRank);
    v("device", r.device);
    v("share", r.share, kSamples);
    v("micro_batch", r.microBatch, kSamples);
    v("micro_batches", r.microBatches, kSamples);
    v("compute_seconds", r.computeSeconds);
    v("samples_per_second", r.samplesPerSecond);
    v("wait_seconds", r.waitSeconds);
    v("peak_bytes", r.peakBytes);
    v("ooms", r.ooms);
    v("settled", r.settled);
}
template <class V>
void describe(V& v, Is<RanksStepped> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("ranks", e.ranks, kRanks);
    v("all_reduce_seconds", e.allReduceSeconds);
    v("imbalance", e.imbalance);
    v("parameters_checked", e.parametersChecked);
    v("collectives", e.collectives);
    v.unless(e.collectivesWhy.empty(), "collectives_why", e.collectivesWhy);
    v.unless(e.nextShares.empty(), "next_shares", e.nextShares, kSamples, kRanks);
    v.unless(e.nextShares.empty(), "share_reason", e.shareReason);
}
template <class V>
void describe(V& v, Is<RankProbed> auto& e) {
    v("time", e.time);
    v("rank", e.rank, kRank);
    v("device", e.device);
    v("probes", e.probes);
    v("trials", e.trials);
    v("finished", e.finished);
    v("ooms", e.ooms);
}
template <class V>
void describe(V& v, Is<SaverOption> auto& o) {
    // A setting that could not be measured has no measurements.
    const bool unmeasured = !o.unavailable.empty();
    v("savers", o.savers);
    v("fits", o.fits);
    v.unless(!unmeasured, "unavailable", o.unavailable);
    v.unless(unmeasured, "fixed_bytes", o.fixedBytes);
    v.unless(unmeasured, "bytes_per_sample", o.bytesPerSample);
    v.unless(unmeasured, "micro_batch", o.microBatch, kSamples);
    v.unless(unmeasured, "accumulation_steps", o.accumulationSteps, kSamples);
    v.unless(unmeasured, "peak_bytes", o.peakBytes);
    v.unless(unmeasured, "samples_per_second", o.samplesPerSecond);
    v.unless(unmeasured, "timed_micro_batch", o.timedMicroBatch, kSamples);
    v.unless(unmeasured, "trials", o.trials);
}
template <class V>
void describe(V& v, Is<SaverSurvey> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("device", e.device);
    v("reason", e.reason);
    v("usable_bytes", e.usableBytes);
    v("target_batch", e.targetBatch, kSamples);
    v("current", e.current);
    v("options", e.options);
    v("suggestion", e.suggestion);
    v("advice", e.advice);
    v("seconds", e.seconds);
}
template <class V>
void describe(V& v, Is<MemorySaversChanged> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("from", e.from);
    v("to", e.to);
    v("why", e.why);
    v("predicted_micro_batch", e.predictedMicroBatch, kSamples);
}
template <class V>
void describe(V& v, Is<LossScaleChanged> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("from", e.from);
    v("to", e.to);
    v("overflow", e.overflow);
    v("redone_samples", e.redoneSamples, kSamples);
}
template <class V>
void describe(V& v, Is<TensorDifference> auto& d) {
    v("name", d.name);
    v("elements", d.elements);
    v("max_abs_difference", d.maxAbsDifference);
    v("relative_difference", d.relativeDifference);
    v("cosine_similarity", d.cosineSimilarity);
}
template <class V>
void describe(V& v, Is<EquivalenceChecked> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("samples", e.samples, kSamples);
    v("micro_batch_sizes", e.microBatchSizes, kSamples);
    v("tensors", e.tensors);
    v("overall", e.overall);
    v("batch_statistics", e.batchStatistics);
    v("full_pass_outside_budget", e.fullPassOutsideBudget);
    v("bfloat16", e.bfloat16);
    v("float16", e.float16);
    v("explanation", e.explanation);
    v("seconds", e.seconds);
    v.unless(e.runningStatisticsRelativeDifference < 0, "running_statistics_relative_difference",
             e.runningStatisticsRelativeDifference);
    v.ranks("ranks", e.rankMicroBatchSizes, e.rankDevices);  // several devices only
    v.unless(e.error.empty(), "error", e.error);
}

template <class V>
void describe(V& v, Is<BlockView> auto& b) {
    v("offset", b.offset);
    v("bytes", b.bytes);
    v("requested_bytes", b.requestedBytes);
    v("allocated", b.allocated);
    v.unless(b.mapped, "mapped", b.mapped);  // written only for an expandable segment's unmapped pages
}
template <class V>
void describe(V& v, Is<SegmentView> auto& s) {
    v("address", s.address);
    v("bytes", s.bytes);
    v("small_pool", s.smallPool);
    v("expandable", s.expandable);
    v("blocks", s.blocks);
}
template <class V>
void describe(V& v, Is<AllocatorSegments> auto& e) {
    v("time", e.time);
    v("step", e.step, kStep);
    v("at_oom", e.atOom);
    v("limit_bytes", e.limitBytes);
    v.unless(!e.atOom, "requested_bytes", e.requestedBytes);
    v.unless(!e.atOom, "segment_bytes", e.segmentBytes);
    v.unless(!e.atOom, "largest_free_block", e.largestFreeBlock);
    v.unless(!e.atOom, "fragmentation", e.fragmentation);
    v("segments", e.segments);
}

template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};

/// The enum value whose toString is `text`, if any (values 0..last).
template <class Enum>
std::optional<Enum> enumNamed(std::string_view text, Enum last) {
    for (int i = 0; i <= static_cast<int>(last); ++i)
        if (text == toString(static_cast<Enum>(i))) return static_cast<Enum>(i);
    return std::nullopt;
}
constexpr RunState lastOf(RunState) {
    return RunState::Failed;
}
constexpr Phase lastOf(Phase) {
    return Phase::Validation;
}
constexpr ProbeReason lastOf(ProbeReason) {
    return ProbeReason::MemorySavers;
}
constexpr const char* kindOf(RunState) {
    return "state";
}
constexpr const char* kindOf(Phase) {
    return "phase";
}
constexpr const char* kindOf(ProbeReason) {
    return "probe reason";
}

/// Writes the fields into a JSON object.
struct Writer {
    json& j;

    template <class M>
    static json value(const M& m) {
        if constexpr (std::is_enum_v<M>) {
            return toString(m);
        } else if constexpr (IsVector<M>::value) {
            if constexpr (std::is_arithmetic_v<typename M::value_type>) {
                return m;
            } else {
                json items = json::array();
                for (const auto& item : m) items.push_back(value(item));
                return items;
            }
        } else if constexpr (std::is_class_v<M> && !std::is_same_v<M, std::string>) {
            json object = json::object();
            Writer nested{object};
            describe(nested, m);
            return object;
        } else {
            return m;
        }
    }
    template <class M, class... Limits>
    void operator()(const char* key, const M& m, Limits...) {
        j[key] = value(m);
    }
    template <class M, class... Limits>
    void unless(bool omit, const char* key, const M& m, Limits...) {
        if (!omit) (*this)(key, m);
    }
    void savers(const char* key, const std::string& savers) { j[key] = savers.empty() ? std::string("off") : savers; }
    void ranks(const char* key, const std::vector<std::vector<int64_t>>& sizes,
               const std::vector<std::string>& devices) {
        if (sizes.empty()) return;
        json ranks = json::array();
        for (size_t r = 0; r < sizes.size(); ++r) {
            ranks.push_back({{"rank", r},
                             {"device", r < devices.size() ? devices[r] : std::string()},
                             {"micro_batch_sizes", sizes[r]}});
        }
        j[key] = std::move(ranks);
    }
};

/// Why a field cannot be read: the key's path and what is wrong ("ranks[1].share: not a whole number").
struct FieldError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Reads the fields from a JSON object; a field of the wrong type (or, with Missing::Error, an
/// absent one the writer always writes) throws FieldError naming it.
struct Reader {
    const json& j;
    std::string path;  ///< where this object is ("", "ranks[1].")
    MissingFields missing;

    [[noreturn]] static void fail(const std::string& where, const std::string& what) {
        throw FieldError("\"" + where + "\": " + what);
    }
    template <class M>
    static void read(const json& from, M& m, const std::string& where, MissingFields missing) {
        if constexpr (std::is_same_v<M, bool>) {
            if (!from.is_boolean()) fail(where, "not true or false");
            m = from.get<bool>();
        } else if constexpr (std::is_integral_v<M>) {
            if (from.is_number_unsigned()) {
                const auto n = from.get<uint64_t>();
                if (n > static_cast<uint64_t>(std::numeric_limits<M>::max())) fail(where, "too large");
                m = static_cast<M>(n);
            } else if (from.is_number_integer()) {
                const auto n = from.get<int64_t>();
                if (n < std::numeric_limits<M>::min() || n > std::numeric_limits<M>::max()) fail(where, "too large");
                m = static_cast<M>(n);
            } else {
                fail(where, "not a whole number");
            }
        } else if constexpr (std::is_floating_point_v<M>) {
            // JSON has no NaN: the writer writes a NaN (a diverged loss) as null.
            if (from.is_null()) {
                m = std::numeric_limits<M>::quiet_NaN();
            } else if (from.is_number()) {
                m = from.get<M>();
            } else {
                fail(where, "not a number");
            }
        } else if constexpr (std::is_same_v<M, std::string>) {
            if (!from.is_string()) fail(where, "not a string");
            m = from.get<std::string>();
        } else if constexpr (std::is_enum_v<M>) {
            if (!from.is_string()) fail(where, "not a string");
            const auto named = enumNamed(from.get_ref<const std::string&>(), lastOf(M{}));
            if (!named) fail(where, std::string("unknown ") + kindOf(M{}) + " \"" + from.get<std::string>() + "\"");
            m = *named;
        } else if constexpr (IsVector<M>::value) {
            if (!from.is_array()) fail(where, "not a list");
            m.clear();
            m.resize(from.size());
            for (size_t i = 0; i < from.size(); ++i)
                read(from[i], m[i], where + "[" + std::to_string(i) + "]", missing);
        } else {
            if (!from.is_object()) fail(where, "not an object");
            Reader nested{from, where + ".", missing};
            describe(nested, m);
        }
    }
    /// Fails unless the number `m` (every number of the list `m`) is within `limit`.
    template <class M>
    static void hold(const M& m, const std::string& where, const Within& limit) {
        if constexpr (IsVector<M>::value) {
            for (size_t i = 0; i < m.size(); ++i) hold(m[i], where + "[" + std::to_string(i) + "]", limit);
        } else {
            static_assert(std::is_integral_v<M> && !std::is_same_v<M, bool>, "limits are for whole numbers");
            if (m < limit.least || m > limit.most) {
                fail(where, std::to_string(m) + " cannot be " + limit.what + " (" + std::to_string(limit.least) +
                                " to " + std::to_string(limit.most) + ")");
            }
        }
    }
    template <class M>
    static void hold(const M&, const std::string&, const AtMost&) {}  // counted before reading
    /// Fails when the list `from` holds more items than `limit`, before any is read.
    static void count(const json& from, const std::string& where, const AtMost& limit) {
        if (from.is_array() && from.size() > limit.items) {
            fail(where, std::to_string(from.size()) + " " + limit.what + ", more than a run can have (" +
                            std::to_string(limit.items) + ")");
        }
    }
    static void count(const json&, const std::string&, const Within&) {}
    template <class M, class... Limits>
    void readWithin(const json& from, M& m, const std::string& where, const Limits&... limits) const {
        (count(from, where, limits), ...);
        read(from, m, where, missing);
        (hold(m, where, limits), ...);
    }
    template <class M, class... Limits>
    void operator()(const char* key, M& m, const Limits&... limits) {
        const auto found = j.find(key);
        if (found != j.end())
            readWithin(*found, m, path + key, limits...);
        else if (missing == MissingFields::Error)
            fail(path + key, "missing");
    }
    template <class M, class... Limits>
    void unless(bool, const char* key, M& m, const Limits&... limits) {
        // Left out where it does not apply: never missing.
        if (const auto found = j.find(key); found != j.end()) readWithin(*found, m, path + key, limits...);
    }
    void savers(const char* key, std::string& savers) {
        (*this)(key, savers);
        if (savers == "off") savers.clear();
    }
    void ranks(const char* key, std::vector<std::vector<int64_t>>& sizes, std::vector<std::string>& devices) {
        const auto found = j.find(key);
        if (found == j.end()) return;
        const std::string where = path + key;
        if (!found->is_array()) fail(where, "not a list");
        count(*found, where, kRanks);
        sizes.assign(found->size(), {});
        devices.assign(found->size(), {});
        for (size_t r = 0; r < found->size(); ++r) {
            const json& rank = (*found)[r];
            const std::string at = where + "[" + std::to_string(r) + "]";
            if (!rank.is_object()) fail(at, "not an object");
            if (const auto d = rank.find("device"); d != rank.end()) read(*d, devices[r], at + ".device", missing);
            if (const auto s = rank.find("micro_batch_sizes"); s != rank.end()) {
                read(*s, sizes[r], at + ".micro_batch_sizes", missing);
                hold(sizes[r], at + ".micro_batch_sizes", kSamples);
            }
        }
    }
};

template <class T>
Event readEvent(const json& j, MissingFields missing) {
    T event;
    Reader reader{j, "", missing};
    describe(reader, event);
    return event;
}

/// Reads one event of each type by its name.
using EventReader = Event (*)(const json&, MissingFields);
template <size_t... I>
std::unordered_map<std::string_view, EventReader> readersByName(std::index_sequence<I...>) {
    return {{eventName(Event(std::in_place_index<I>)), &readEvent<std::variant_alternative_t<I, Event>>}...};
}
const std::unordered_map<std::string_view, EventReader>& eventReaders() {
    static const auto readers = readersByName(std::make_index_sequence<std::variant_size_v<Event>>{});
    return readers;
}

}  // namespace

bool isRankReported(const Event& event) {
    return std::holds_alternative<ProbeStarted>(event) || std::holds_alternative<ProbeTrial>(event) ||
           std::holds_alternative<ProbeFinished>(event) || std::holds_alternative<OomEvent>(event);
}

std::string rankReportText(const std::vector<Event>& events, double now) {
    json report = json::array();
    for (const Event& event : events) {
        if (!isRankReported(event)) continue;
        json j = toJson(event);
        j["age"] = now - j.at("time").get<double>();  // clocks differ between processes; ages do not
        j.erase("time");
        report.push_back(std::move(j));
    }
    return report.empty() ? std::string() : report.dump(-1, ' ', false, json::error_handler_t::replace);
}

tl::expected<RankProbed, std::string> readRankReport(const std::string& text, double now) {
    RankProbed report;
    if (text.empty()) return report;
    const json all = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!all.is_array()) return tl::make_unexpected(std::string("not a JSON array of events"));
    for (size_t index = 0; index < all.size(); ++index) {
        const auto fail = [&](const std::string& what) {
            return tl::make_unexpected("event " + std::to_string(index + 1) + ": " + what);
        };
        json j = all[index];
        if (!j.is_object()) return fail("not a JSON object");
        const auto type = j.find("type");
        const std::string name = type != j.end() && type->is_string() ? type->get<std::string>() : std::string();
        if (name != "probe_started" && name != "probe_trial" && name != "probe_finished" && name != "oom")
            return fail("an event of type \"" + name + "\", which ranks do not report");
        j["time"] = 0;                                        // sent as its age (below)
        auto event = eventFromJson(j, MissingFields::Error);  // both ends are this build
        if (!event) return fail(event.error());
        const auto age = j.find("age");
        if (age == j.end() || !age->is_number()) return fail("\"age\": missing, or not a number");
        const double time = now - age->get<double>();
        std::visit(
            [&](auto& e) {
                using T = std::decay_t<decltype(e)>;
                e.time = time;
                if constexpr (std::is_same_v<T, ProbeStarted>) report.probes.push_back(e);
                if constexpr (std::is_same_v<T, ProbeTrial>) report.trials.push_back(e);
                if constexpr (std::is_same_v<T, ProbeFinished>) report.finished.push_back(e);
                if constexpr (std::is_same_v<T, OomEvent>) report.ooms.push_back(e);
            },
            *event);
    }
    return report;
}

json toJson(const Event& event) {
    json j = json::object();
    std::visit(
        [&j](const auto& e) {
            Writer writer{j};
            describe(writer, e);
        },
        event);
    j["type"] = eventName(event);
    return j;
}

std::string toJsonLine(const Event& event) {
    // Replace invalid UTF-8 rather than throw: messages can carry text from the library.
    return toJson(event).dump(-1, ' ', false, json::error_handler_t::replace);
}

tl::expected<Event, std::string> eventFromJson(const json& j, MissingFields missing) {
    if (!j.is_object()) return tl::make_unexpected(std::string("not a JSON object"));
    const auto type = j.find("type");
    if (type == j.end() || !type->is_string()) return tl::make_unexpected(std::string("no \"type\""));
    const auto& name = type->get_ref<const std::string&>();
    const auto reader = eventReaders().find(name);
    if (reader == eventReaders().end())
        return tl::make_unexpected("an event of unknown type \"" + name + "\" (written by a newer BatchPilot?)");
    try {
        return reader->second(j, missing);
    } catch (const FieldError& e) {
        return tl::make_unexpected(name + " " + e.what());
    }
}

tl::expected<Event, std::string> eventFromJsonLine(std::string_view line) {
    bool tooDeep = false;
    const json::parser_callback_t depthLimit = [&](int depth, json::parse_event_t, json&) {
        if (depth > kMaxEventDepth) tooDeep = true;
        return depth <= kMaxEventDepth;
    };
    const json j = json::parse(line.begin(), line.end(), depthLimit, /*allow_exceptions=*/false);
    if (tooDeep) return tl::make_unexpected("nested deeper than " + std::to_string(kMaxEventDepth) + " levels");
    if (j.is_discarded()) return tl::make_unexpected(std::string("not JSON (a line cut off, or damaged)"));
    return eventFromJson(j);
}

}  // namespace batchpilot::core
