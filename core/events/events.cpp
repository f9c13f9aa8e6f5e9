#include "core/events/events.h"

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

namespace {

// One overload per event type: an event type added to Event without its name here does not
// compile (eventName's visit finds no overload), rather than being written under another's name.
const char* nameOf(const RunStateChanged&) {
    return "state";
}
const char* nameOf(const ProbeStarted&) {
    return "probe_started";
}
const char* nameOf(const ProbeTrial&) {
    return "probe_trial";
}
const char* nameOf(const ProbeFinished&) {
    return "probe_finished";
}
const char* nameOf(const OomEvent&) {
    return "oom";
}
const char* nameOf(const MemorySample&) {
    return "memory";
}
const char* nameOf(const StepMetrics&) {
    return "step";
}
const char* nameOf(const MicroBatchDone&) {
    return "micro_batch";
}
const char* nameOf(const OptimizerStepped&) {
    return "optimizer_step";
}
const char* nameOf(const TargetBatchChanged&) {
    return "target_batch";
}
const char* nameOf(const DeviceSwitched&) {
    return "device_switch";
}
const char* nameOf(const Warning&) {
    return "warning";
}
const char* nameOf(const CheckpointSaved&) {
    return "checkpoint";
}
const char* nameOf(const ErrorEvent&) {
    return "error";
}
const char* nameOf(const RunSummary&) {
    return "run_summary";
}
const char* nameOf(const MemoryBreakdown&) {
    return "memory_breakdown";
}
const char* nameOf(const StepModeWaiting&) {
    return "step_mode_waiting";
}
const char* nameOf(const ThroughputTimed&) {
    return "throughput_timed";
}
const char* nameOf(const ThroughputChecked&) {
    return "throughput_check";
}
const char* nameOf(const ThroughputChosen&) {
    return "throughput_chosen";
}
const char* nameOf(const ValidationDone&) {
    return "validation";
}
const char* nameOf(const RanksStepped&) {
    return "ranks_step";
}
const char* nameOf(const RankProbed&) {
    return "rank_probe";
}
const char* nameOf(const SaverSurvey&) {
    return "saver_survey";
}
const char* nameOf(const MemorySaversChanged&) {
    return "memory_savers_changed";
}
const char* nameOf(const LossScaleChanged&) {
    return "loss_scale_changed";
}
const char* nameOf(const EquivalenceChecked&) {
    return "equivalence";
}
const char* nameOf(const AllocatorSegments&) {
    return "allocator_segments";
}

}  // namespace

int64_t AllocatorSegments::reservedBytes() const {
    int64_t total = 0;
    for (const SegmentView& segment : segments) total += segment.bytes;
    return total;
}

int64_t AllocatorSegments::allocatedBytes() const {
    int64_t total = 0;
    for (const SegmentView& segment : segments) total += segment.allocatedBytes();
    return total;
}

const char* eventName(const Event& event) {
    return std::visit([](const auto& e) { return nameOf(e); }, event);
}

}  // namespace batchpilot::core
