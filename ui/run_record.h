#pragma once

#include <deque>

#include <QString>

#include "core/events.h"

namespace batchpilot::ui {

/// What a run said, kept for the File menu's exports: every step's metrics (metrics CSV) and
/// every event but the high-rate memory (samples and per-step breakdowns) and micro-batch ones
/// (events JSONL). Bounded: the oldest entries go first past the limits.
class RunRecord {
public:
    void handle(const core::Event& event);
    void clear();

    std::size_t stepCount() const { return m_steps.size(); }
    std::size_t eventCount() const { return m_events.size(); }
    const std::deque<core::Event>& events() const { return m_events; }
    const std::deque<core::StepMetrics>& steps() const { return m_steps; }

    /// One row per optimizer step; the header names the columns and their units.
    bool writeMetricsCsv(const QString& path, QString* error = nullptr) const;
    /// One JSON object per line, the CLI's event names.
    bool writeEventsJsonl(const QString& path, QString* error = nullptr) const;

    static constexpr std::size_t kMaxSteps = 2'000'000;
    static constexpr std::size_t kMaxEvents = 500'000;

private:
    std::deque<core::StepMetrics> m_steps;
    std::deque<core::Event> m_events;
};

}  // namespace batchpilot::ui
