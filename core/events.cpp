#include "core/events.h"

#include <cmath>
#include <type_traits>

namespace batchpilot::core {

const char* toString(RunState state) {
    switch (state) {
    case RunState::Idle: return "idle";
    case RunState::Starting: return "starting";
    case RunState::Probing: return "probing";
    case RunState::Training: return "training";
    case RunState::Paused: return "paused";
    case RunState::Stopping: return "stopping";
    case RunState::Finished: return "finished";
    case RunState::Failed: return "failed";
    }
    return "unknown";
}

const char* toString(Phase phase) {
    switch (phase) {
    case Phase::Copy: return "host-to-device copy";
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::OptimizerStep: return "optimizer step";
    case Phase::Setup: return "setup";
    case Phase::Validation: return "validation";
    }
    return "unknown";
}

const std::vector<std::string>& validationMetricNames() {
    static const std::vector<std::string> names{"val_loss", "val_accuracy", "val_top5_accuracy", "val_mse", "val_mae"};
    return names;
}

bool higherIsBetter(const std::string& metric) {
    return metric == "val_accuracy" || metric == "val_top5_accuracy";
}

bool improves(const std::string& metric, double value, double best) {
    if (std::isnan(value)) return false;
    if (std::isnan(best)) return true;
    return higherIsBetter(metric) ? value > best : value < best;
}

std::optional<double> validationMetric(const ValidationDone& done, const std::string& metric) {
    // Metrics a pass does not have are -1 in the event.
    const auto present = [](double value) { return value >= 0 ? std::optional<double>(value) : std::nullopt; };
    if (metric == "val_loss") return done.loss;
    if (metric == "val_accuracy") return present(done.accuracy);
    if (metric == "val_top5_accuracy") return present(done.top5Accuracy);
    if (metric == "val_mse") return present(done.meanSquaredError);
    if (metric == "val_mae") return present(done.meanAbsoluteError);
    return std::nullopt;
}

const char* toString(ProbeReason reason) {
    switch (reason) {
    case ProbeReason::Initial: return "initial";
    case ProbeReason::UserRequest: return "re-probe requested";
    case ProbeReason::DeviceSwitch: return "device switch";
    case ProbeReason::TargetBatchChange: return "target batch change";
    case ProbeReason::Regrow: return "memory may have come back";
    case ProbeReason::MemorySavers: return "memory savers turned on";
    }
    return "unknown";
}

std::string describeSplit(const EquivalenceChecked& check) {
    const auto sum = [](const std::vector<int64_t>& sizes) {
        std::string text;
        for (size_t i = 0; i < sizes.size(); ++i) text += (i > 0 ? " + " : "") + std::to_string(sizes[i]);
        return text.empty() ? std::string("no samples") : text;
    };
    if (check.rankMicroBatchSizes.empty()) return sum(check.microBatchSizes);
    std::string text;
    for (size_t r = 0; r < check.rankMicroBatchSizes.size(); ++r) {
        text += (r > 0 ? ", rank " : "rank ") + std::to_string(r);
        if (r < check.rankDevices.size()) text += " (" + check.rankDevices[r] + ")";
        text += " " + sum(check.rankMicroBatchSizes[r]);
    }
    return text + ", summed over the ranks";
}

size_t microBatchCount(const EquivalenceChecked& check) {
    if (check.rankMicroBatchSizes.empty()) return check.microBatchSizes.size();
    size_t count = 0;
    for (const auto& part : check.rankMicroBatchSizes) count += part.size();
    return count;
}

const char* eventName(const Event& event) {
    return std::visit(
        [](const auto& e) -> const char* {
            using T = std::decay_t<decltype(e)>;
            if constexpr (std::is_same_v<T, RunStateChanged>)
                return "state";
            else if constexpr (std::is_same_v<T, ProbeStarted>)
                return "probe_started";
            else if constexpr (std::is_same_v<T, ProbeTrial>)
                return "probe_trial";
            else if constexpr (std::is_same_v<T, ProbeFinished>)
                return "probe_finished";
            else if constexpr (std::is_same_v<T, OomEvent>)
                return "oom";
            else if constexpr (std::is_same_v<T, MemorySample>)
                return "memory";
            else if constexpr (std::is_same_v<T, StepMetrics>)
                return "step";
            else if constexpr (std::is_same_v<T, MicroBatchDone>)
                return "micro_batch";
            else if constexpr (std::is_same_v<T, OptimizerStepped>)
                return "optimizer_step";
            else if constexpr (std::is_same_v<T, TargetBatchChanged>)
                return "target_batch";
            else if constexpr (std::is_same_v<T, DeviceSwitched>)
                return "device_switch";
            else if constexpr (std::is_same_v<T, Warning>)
                return "warning";
            else if constexpr (std::is_same_v<T, CheckpointSaved>)
                return "checkpoint";
            else if constexpr (std::is_same_v<T, ErrorEvent>)
                return "error";
            else if constexpr (std::is_same_v<T, RunSummary>)
                return "run_summary";
            else if constexpr (std::is_same_v<T, MemoryBreakdown>)
                return "memory_breakdown";
            else if constexpr (std::is_same_v<T, StepModeWaiting>)
                return "step_mode_waiting";
            else if constexpr (std::is_same_v<T, ThroughputTimed>)
                return "throughput_timed";
            else if constexpr (std::is_same_v<T, ThroughputChosen>)
                return "throughput_chosen";
            else if constexpr (std::is_same_v<T, ValidationDone>)
                return "validation";
            else if constexpr (std::is_same_v<T, RanksStepped>)
                return "ranks_step";
            else if constexpr (std::is_same_v<T, RankProbed>)
                return "rank_probe";
            else if constexpr (std::is_same_v<T, SaverSurvey>)
                return "saver_survey";
            else if constexpr (std::is_same_v<T, MemorySaversChanged>)
                return "memory_savers_changed";
            else if constexpr (std::is_same_v<T, LossScaleChanged>)
                return "loss_scale_changed";
            else
                return "equivalence";
        },
        event);
}

}  // namespace batchpilot::core
