#pragma once

#include <functional>
#include <mutex>
#include <set>
#include <vector>

#include "core/events/events.h"

namespace batchpilot::tests {

/// Keeps every event (thread-safe) and lets a test react to events on the trainer thread.
class RecordingSink final : public core::EventSink {
public:
    std::function<void(const core::Event&)> onEach;

    void onEvent(const core::Event& event) override {
        {
            std::lock_guard lock(m_mutex);
            m_events.push_back(event);
        }
        if (onEach) onEach(event);
    }

    std::vector<core::Event> events() const {
        std::lock_guard lock(m_mutex);
        return m_events;
    }

    /// All events of type T, in order.
    template <typename T>
    std::vector<T> all() const {
        std::vector<T> out;
        std::lock_guard lock(m_mutex);
        for (const auto& e : m_events) {
            if (const auto* typed = std::get_if<T>(&e)) out.push_back(*typed);
        }
        return out;
    }

    /// The micro-batches that made their steps. One with index 0 starts its step's batch over
    /// (after an OOM in backward, or a float16 overflow): the ones before it in that step were
    /// trained again, so they do not count. Nor do those of a step that never reported its
    /// metrics: a stop answers within one micro-batch and drops the unfinished step.
    std::vector<core::MicroBatchDone> committedMicroBatches() const {
        std::vector<core::MicroBatchDone> out;
        std::set<int64_t> finished;
        {
            std::lock_guard lock(m_mutex);
            for (const auto& e : m_events)
                if (const auto* m = std::get_if<core::StepMetrics>(&e)) finished.insert(m->step);
        }
        for (const core::MicroBatchDone& m : all<core::MicroBatchDone>()) {
            if (m.index == 0) std::erase_if(out, [&](const core::MicroBatchDone& o) { return o.step == m.step; });
            out.push_back(m);
        }
        std::erase_if(out, [&](const core::MicroBatchDone& m) { return !finished.contains(m.step); });
        return out;
    }

    /// OOMs reported after the first probe finished: training at the size a probe chose must
    /// not need its recovery.
    int oomsAfterFirstProbe() const {
        bool probed = false;
        int ooms = 0;
        for (const core::Event& e : events()) {
            if (std::holds_alternative<core::ProbeFinished>(e)) probed = true;
            if (probed && std::holds_alternative<core::OomEvent>(e)) ++ooms;
        }
        return ooms;
    }

private:
    mutable std::mutex m_mutex;
    std::vector<core::Event> m_events;
};

}  // namespace batchpilot::tests
