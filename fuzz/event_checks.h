#pragma once
// Shared by the harnesses of the event readers: an event read holds no number no run can have
// (core/events/event_limits.h), which the window would spend time or memory on in proportion.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/events/event_limits.h"

namespace batchpilot::fuzz {

inline bool within(const nlohmann::json& j, const char* key, int64_t most) {
    const auto found = j.find(key);
    if (found == j.end() || !found->is_number_integer()) return true;
    const auto n = found->get<int64_t>();
    return n >= 0 && n <= most;
}

/// The event's numbers, as written (core::toJson), are within what a run can have.
inline bool possible(const nlohmann::json& j) {
    using namespace batchpilot::core;
    if (!within(j, "step", kMaxEventSteps)) return false;
    for (const char* key : {"target_batch", "micro_batch", "accumulation_steps", "offset", "size", "share",
                            "micro_batches", "new_target", "old_target", "upper_bound", "new_micro_batch"})
        if (!within(j, key, kMaxEventSamples)) return false;
    if (!within(j, "trial", kMaxEventTrials)) return false;
    if (j.value("type", std::string()) == "probe_finished" && !within(j, "trials", kMaxEventTrials)) return false;
    if (!within(j, "rank", kMaxEventRanks - 1)) return false;
    if (const auto ranks = j.find("ranks"); ranks != j.end() && ranks->is_array()) {
        if (ranks->size() > static_cast<size_t>(kMaxEventRanks)) return false;
        for (const auto& rank : *ranks)
            if (rank.is_object() && !possible(rank)) return false;
    }
    return true;
}

}  // namespace batchpilot::fuzz
