#include "core/events/event_json.h"

#include <optional>
#include <stdexcept>

namespace batchpilot::core {
namespace {

using nlohmann::json;

json fields(const RunStateChanged& e) {
    return {{"time", e.time}, {"state", toString(e.state)}, {"detail", e.detail}};
}
json fields(const ProbeStarted& e) {
    return {{"time", e.time},
            {"sequence", e.sequence},
            {"reason", toString(e.reason)},
            {"device", e.device},
            {"upper_bound", e.upperBound},
            {"usable_bytes", e.usableBytes},
            {"reserved_bytes", e.reservedBytes}};
}
json fields(const ProbeTrial& e) {
    return {{"time", e.time},
            {"sequence", e.sequence},
            {"trial", e.trial},
            {"micro_batch", e.microBatch},
            {"fit", e.fit},
            {"within_headroom", e.withinHeadroom},
            {"peak_bytes", e.peakBytes},
            {"failed_allocation_bytes", e.failedAllocationBytes},
            {"seconds", e.seconds}};
}
json fields(const ProbeFinished& e) {
    return {{"time", e.time},
            {"sequence", e.sequence},
            {"micro_batch", e.microBatch},
            {"accumulation_steps", e.accumulationSteps},
            {"target_batch", e.targetBatch},
            {"trials", e.trials},
            {"seconds", e.seconds},
            {"hit_trial_limit", e.hitTrialLimit},
            {"fixed_bytes", e.fixedBytes},
            {"bytes_per_sample", e.bytesPerSample}};
}
json fields(const OomEvent& e) {
    return {{"time", e.time},
            {"step", e.step},
            {"phase", toString(e.phase)},
            {"micro_batch", e.microBatch},
            {"requested_bytes", e.requestedBytes},
            {"message", e.message},
            {"recovered", e.recovered},
            {"new_micro_batch", e.newMicroBatch},
            {"redone_samples", e.redoneSamples}};
}
json fields(const MemorySample& e) {
    return {{"time", e.time},
            {"allocated_bytes", e.allocatedBytes},
            {"reserved_bytes", e.reservedBytes},
            {"peak_bytes", e.peakBytes},
            {"capacity_bytes", e.capacityBytes},
            {"headroom_bytes", e.headroomBytes}};
}
json fields(const StepMetrics& e) {
    return {{"time", e.time},
            {"step", e.step},
            {"epoch", e.epoch},
            {"samples_seen", e.samplesSeen},
            {"loss", e.loss},
            {"micro_batch", e.microBatch},
            {"accumulation_steps", e.accumulationSteps},
            {"target_batch", e.targetBatch},
            {"learning_rate", e.learningRate},
            {"samples_per_second", e.samplesPerSecond},
            {"step_seconds", e.stepSeconds},
            {"peak_bytes", e.peakBytes},
            {"total_steps", e.totalSteps}};
}
json fields(const MicroBatchDone& e) {
    json j = {{"time", e.time},
              {"step", e.step},
              {"index", e.index},
              {"offset", e.offset},
              {"size", e.size},
              {"target_batch", e.targetBatch},
              {"loss_weight", e.lossWeight},
              {"loss", e.loss},
              {"probe_trial", e.probeTrial}};
    if (!e.sampleIndices.empty()) {
        j["sample_indices"] = e.sampleIndices;
    }
    if (e.gradientNorm > 0) {
        j["gradient_norm"] = e.gradientNorm;
    }
    return j;
}
json fields(const OptimizerStepped& e) {
    return {{"time", e.time}, {"step", e.step}, {"micro_batches", e.microBatches}};
}
json fields(const TargetBatchChanged& e) {
    return {{"time", e.time},
            {"old_target", e.oldTarget},
            {"new_target", e.newTarget},
            {"old_learning_rate", e.oldLearningRate},
            {"new_learning_rate", e.newLearningRate}};
}
json fields(const DeviceSwitched& e) {
    return {{"time", e.time}, {"from", e.from}, {"to", e.to}, {"rank", e.rank}};
}
json fields(const Warning& e) {
    return {{"time", e.time}, {"message", e.message}};
}
json fields(const CheckpointSaved& e) {
    json j = {{"time", e.time}, {"step", e.step}, {"path", e.path}};
    if (!e.metric.empty()) {
        j["metric"] = e.metric;
        j["value"] = e.value;
    }
    return j;
}
json fields(const ErrorEvent& e) {
    return {{"time", e.time}, {"message", e.message}, {"where", e.where}};
}
json fields(const RunSummary& e) {
    return {{"time", e.time},
            {"device", e.device},
            {"model", e.model},
            {"parameter_count", e.parameterCount},
            {"parameter_tensors", e.parameterTensors},
            {"dataset", e.dataset},
            {"dataset_size", e.datasetSize},
            {"input_shape", e.inputShape},
            {"optimizer", e.optimizer},
            {"loss", e.loss},
            {"target_batch", e.targetBatch},
            {"batch_statistics", e.batchStatistics}};
}
json fields(const MemoryBreakdown& e) {
    return {{"time", e.time},
            {"step", e.step},
            {"device", e.device},
            {"total_bytes", e.totalBytes},
            {"capacity_bytes", e.capacityBytes},
            {"usable_bytes", e.usableBytes},
            {"parameter_bytes", e.parameterBytes},
            {"gradient_bytes", e.gradientBytes},
            {"optimizer_state_bytes", e.optimizerStateBytes},
            {"optimizer_state_reserved", e.optimizerStateReserved},
            {"activation_bytes", e.activationBytes},
            {"activation_micro_batch", e.activationMicroBatch},
            {"input_bytes", e.inputBytes},
            {"buffer_copy_bytes", e.bufferCopyBytes},
            {"largest_gradient_bytes", e.largestGradientBytes},
            {"resident_bytes", e.residentBytes},
            {"peak_bytes", e.peakBytes},
            {"cache_bytes", e.cacheBytes},
            {"other_process_bytes", e.otherProcessBytes},
            {"context_bytes", e.contextBytes},
            {"workspace_bytes", e.workspaceBytes},
            {"free_bytes", e.freeBytes},
            {"memory_savers", e.memorySavers.empty() ? std::string("off") : e.memorySavers}};
}
json fields(const StepModeWaiting& e) {
    return {{"time", e.time},
            {"step", e.step},
            {"index", e.index},
            {"offset", e.offset},
            {"size", e.size},
            {"target_batch", e.targetBatch},
            {"probe_trial", e.probeTrial}};
}
json fields(const ThroughputTimed& e) {
    return {{"time", e.time},
            {"sequence", e.sequence},
            {"micro_batch", e.microBatch},
            {"samples_per_second", e.samplesPerSecond},
            {"repetitions", e.repetitions}};
}
json fields(const ThroughputChosen& e) {
    return {{"time", e.time},
            {"sequence", e.sequence},
            {"micro_batch", e.microBatch},
            {"largest_micro_batch", e.largestMicroBatch},
            {"accumulation_steps", e.accumulationSteps},
            {"target_batch", e.targetBatch},
            {"samples_per_second", e.samplesPerSecond},
            {"largest_samples_per_second", e.largestSamplesPerSecond},
            {"speed_over_largest", e.speedOverLargest},
            {"step_speed_over_largest", e.stepSpeedOverLargest},
            {"step_seconds", e.stepSeconds},
            {"micro_batch_seconds", e.microBatchSeconds},
            {"micro_batches_timed", e.microBatchesTimed},
            {"seconds", e.seconds},
            {"reason", e.reason}};
}
json fields(const ValidationDone& e) {
    json j = {{"time", e.time},
              {"step", e.step},
              {"epoch", e.epoch},
              {"samples_seen", e.samplesSeen},
              {"samples", e.samples},
              {"loss", e.loss},
              {"micro_batch", e.microBatch},
              {"ooms", e.ooms},
              {"seconds", e.seconds}};
    // Metrics that do not apply to the data are left out rather than written as -1.
    if (e.accuracy >= 0) j["accuracy"] = e.accuracy;
    if (e.top5Accuracy >= 0) j["top5_accuracy"] = e.top5Accuracy;
    if (e.meanSquaredError >= 0) j["mse"] = e.meanSquaredError;
    if (e.meanAbsoluteError >= 0) j["mae"] = e.meanAbsoluteError;
    return j;
}
json fields(const RankStep& r) {
    return {{"rank", r.rank},
            {"device", r.device},
            {"share", r.share},
            {"micro_batch", r.microBatch},
            {"micro_batches", r.microBatches},
            {"compute_seconds", r.computeSeconds},
            {"samples_per_second", r.samplesPerSecond},
            {"wait_seconds", r.waitSeconds},
            {"peak_bytes", r.peakBytes},
            {"ooms", r.ooms},
            {"settled", r.settled}};
}
json fields(const RanksStepped& e) {
    json ranks = json::array();
    for (const RankStep& r : e.ranks) ranks.push_back(fields(r));
    json j = {{"time", e.time},
              {"step", e.step},
              {"ranks", ranks},
              {"all_reduce_seconds", e.allReduceSeconds},
              {"imbalance", e.imbalance},
              {"parameters_checked", e.parametersChecked},
              {"collectives", e.collectives}};
    if (!e.collectivesWhy.empty()) j["collectives_why"] = e.collectivesWhy;
    if (!e.nextShares.empty()) {
        j["next_shares"] = e.nextShares;
        j["share_reason"] = e.shareReason;
    }
    return j;
}
json fields(const RankProbed& e) {
    json j = {{"time", e.time}, {"rank", e.rank}, {"device", e.device}};
    const auto list = [](const auto& events) {
        json items = json::array();
        for (const auto& item : events) items.push_back(fields(item));
        return items;
    };
    j["probes"] = list(e.probes);
    j["trials"] = list(e.trials);
    j["finished"] = list(e.finished);
    j["ooms"] = list(e.ooms);
    return j;
}
json fields(const SaverOption& o) {
    json j = {{"savers", o.savers}, {"fits", o.fits}};
    if (!o.unavailable.empty()) {
        j["unavailable"] = o.unavailable;
        return j;
    }
    j.update({{"fixed_bytes", o.fixedBytes},
              {"bytes_per_sample", o.bytesPerSample},
              {"micro_batch", o.microBatch},
              {"accumulation_steps", o.accumulationSteps},
              {"peak_bytes", o.peakBytes},
              {"samples_per_second", o.samplesPerSecond},
              {"timed_micro_batch", o.timedMicroBatch},
              {"trials", o.trials}});
    return j;
}
json fields(const SaverSurvey& e) {
    json options = json::array();
    for (const SaverOption& o : e.options) options.push_back(fields(o));
    return {{"time", e.time},
            {"step", e.step},
            {"device", e.device},
            {"reason", e.reason},
            {"usable_bytes", e.usableBytes},
            {"target_batch", e.targetBatch},
            {"current", e.current},
            {"options", options},
            {"suggestion", e.suggestion},
            {"advice", e.advice},
            {"seconds", e.seconds}};
}
json fields(const MemorySaversChanged& e) {
    return {{"time", e.time}, {"step", e.step}, {"from", e.from},
            {"to", e.to},     {"why", e.why},   {"predicted_micro_batch", e.predictedMicroBatch}};
}
json fields(const LossScaleChanged& e) {
    return {{"time", e.time}, {"step", e.step},         {"from", e.from},
            {"to", e.to},     {"overflow", e.overflow}, {"redone_samples", e.redoneSamples}};
}
json fields(const TensorDifference& d) {
    return {{"name", d.name},
            {"elements", d.elements},
            {"max_abs_difference", d.maxAbsDifference},
            {"relative_difference", d.relativeDifference},
            {"cosine_similarity", d.cosineSimilarity}};
}
json fields(const EquivalenceChecked& e) {
    json tensors = json::array();
    for (const TensorDifference& d : e.tensors) tensors.push_back(fields(d));
    json j = {{"time", e.time},
              {"step", e.step},
              {"samples", e.samples},
              {"micro_batch_sizes", e.microBatchSizes},
              {"tensors", tensors},
              {"overall", fields(e.overall)},
              {"batch_statistics", e.batchStatistics},
              {"full_pass_outside_budget", e.fullPassOutsideBudget},
              {"bfloat16", e.bfloat16},
              {"float16", e.float16},
              {"explanation", e.explanation},
              {"seconds", e.seconds}};
    if (e.runningStatisticsRelativeDifference >= 0) {
        j["running_statistics_relative_difference"] = e.runningStatisticsRelativeDifference;
    }
    if (!e.rankMicroBatchSizes.empty()) {
        json ranks = json::array();
        for (size_t r = 0; r < e.rankMicroBatchSizes.size(); ++r) {
            ranks.push_back({{"rank", r},
                             {"device", r < e.rankDevices.size() ? e.rankDevices[r] : std::string()},
                             {"micro_batch_sizes", e.rankMicroBatchSizes[r]}});
        }
        j["ranks"] = ranks;
    }
    if (!e.error.empty()) j["error"] = e.error;
    return j;
}

/// The enum value whose toString is `text`, if any (values 0..last).
template <class Enum>
std::optional<Enum> enumNamed(const std::string& text, Enum last) {
    for (int i = 0; i <= static_cast<int>(last); ++i)
        if (text == toString(static_cast<Enum>(i))) return static_cast<Enum>(i);
    return std::nullopt;
}

/// One reported event read back from fields(); throws json::exception on a missing or mistyped
/// field, std::invalid_argument on an unknown name.
template <class T>
T readFields(const json& j);

template <>
ProbeStarted readFields(const json& j) {
    ProbeStarted e;
    e.sequence = j.at("sequence").get<int>();
    const auto reason = enumNamed(j.at("reason").get<std::string>(), ProbeReason::MemorySavers);
    if (!reason) throw std::invalid_argument("unknown probe reason \"" + j.at("reason").get<std::string>() + "\"");
    e.reason = *reason;
    e.device = j.at("device").get<std::string>();
    e.upperBound = j.at("upper_bound").get<int64_t>();
    e.usableBytes = j.at("usable_bytes").get<int64_t>();
    e.reservedBytes = j.at("reserved_bytes").get<int64_t>();
    return e;
}
template <>
ProbeTrial readFields(const json& j) {
    ProbeTrial e;
    e.sequence = j.at("sequence").get<int>();
    e.trial = j.at("trial").get<int>();
    e.microBatch = j.at("micro_batch").get<int64_t>();
    e.fit = j.at("fit").get<bool>();
    e.withinHeadroom = j.at("within_headroom").get<bool>();
    e.peakBytes = j.at("peak_bytes").get<int64_t>();
    e.failedAllocationBytes = j.at("failed_allocation_bytes").get<int64_t>();
    e.seconds = j.at("seconds").get<double>();
    return e;
}
template <>
ProbeFinished readFields(const json& j) {
    ProbeFinished e;
    e.sequence = j.at("sequence").get<int>();
    e.microBatch = j.at("micro_batch").get<int64_t>();
    e.accumulationSteps = j.at("accumulation_steps").get<int64_t>();
    e.targetBatch = j.at("target_batch").get<int64_t>();
    e.trials = j.at("trials").get<int>();
    e.seconds = j.at("seconds").get<double>();
    e.hitTrialLimit = j.at("hit_trial_limit").get<bool>();
    e.fixedBytes = j.at("fixed_bytes").get<double>();
    e.bytesPerSample = j.at("bytes_per_sample").get<double>();
    return e;
}
template <>
OomEvent readFields(const json& j) {
    OomEvent e;
    e.step = j.at("step").get<int64_t>();
    const auto phase = enumNamed(j.at("phase").get<std::string>(), Phase::Validation);
    if (!phase) throw std::invalid_argument("unknown phase \"" + j.at("phase").get<std::string>() + "\"");
    e.phase = *phase;
    e.microBatch = j.at("micro_batch").get<int64_t>();
    e.requestedBytes = j.at("requested_bytes").get<int64_t>();
    e.message = j.at("message").get<std::string>();
    e.recovered = j.at("recovered").get<bool>();
    e.newMicroBatch = j.at("new_micro_batch").get<int64_t>();
    e.redoneSamples = j.value("redone_samples", int64_t{0});  // absent from runs before it existed
    return e;
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
    size_t index = 0;
    try {
        for (; index < all.size(); ++index) {
            const json& j = all[index];
            const std::string type = j.at("type").get<std::string>();
            const double time = now - j.at("age").get<double>();
            if (type == "probe_started") {
                report.probes.push_back(readFields<ProbeStarted>(j));
                report.probes.back().time = time;
            } else if (type == "probe_trial") {
                report.trials.push_back(readFields<ProbeTrial>(j));
                report.trials.back().time = time;
            } else if (type == "probe_finished") {
                report.finished.push_back(readFields<ProbeFinished>(j));
                report.finished.back().time = time;
            } else if (type == "oom") {
                report.ooms.push_back(readFields<OomEvent>(j));
                report.ooms.back().time = time;
            } else {
                throw std::invalid_argument("an event of type \"" + type + "\", which ranks do not report");
            }
        }
    } catch (const std::exception& e) {
        return tl::make_unexpected("event " + std::to_string(index + 1) + ": " + e.what());
    }
    return report;
}

json toJson(const Event& event) {
    json j = std::visit([](const auto& e) { return fields(e); }, event);
    j["type"] = eventName(event);
    return j;
}

std::string toJsonLine(const Event& event) {
    // Replace invalid UTF-8 rather than throw: messages can carry text from the library.
    return toJson(event).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace batchpilot::core
