#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include <QString>

#include "core/events/events.h"

class QTemporaryFile;

namespace batchpilot::ui {

/// What a run said, kept for the File menu's exports: every step's metrics (metrics CSV) and
/// every event but the high-rate memory, micro-batch and breakdown ones (events JSONL).
///
/// The steps go to a temporary file as they arrive (fixed-size binary records, no formatting),
/// so a run of millions of steps costs disk, not memory; the other events are few and stay in
/// memory, each with the number of steps recorded before it, so the JSON Lines export puts
/// everything back in the order it happened. When the temporary file cannot be written the
/// steps stay in memory, and a warning among the events says so.
class RunRecord {
public:
    RunRecord();
    ~RunRecord();
    RunRecord(const RunRecord&) = delete;
    RunRecord& operator=(const RunRecord&) = delete;

    void handle(const core::Event& event);
    void clear();

    std::size_t stepCount() const { return m_stepCount; }
    std::size_t eventCount() const { return m_events.size(); }
    /// The kept events other than the steps, oldest first.
    const std::deque<core::Event>& events() const { return m_events; }
    /// Every step's metrics, oldest first (read back from the temporary file).
    std::vector<core::StepMetrics> steps() const;
    /// Memory the record holds (the events and any steps kept in memory), in bytes.
    std::size_t memoryBytes() const;

    /// One row per optimizer step; the header names the columns and their units.
    bool writeMetricsCsv(const QString& path, QString* error = nullptr) const;
    /// One JSON object per line, the CLI's event names, in the order the run sent them.
    bool writeEventsJsonl(const QString& path, QString* error = nullptr) const;

    /// Events kept in memory at most; the oldest go first past it (the steps are all kept).
    static constexpr std::size_t kMaxEvents = 500'000;

private:
    void appendStep(const core::StepMetrics& metrics);
    /// Calls `visit` for every step in order; false when the temporary file could not be read.
    bool forEachStep(const std::function<void(const core::StepMetrics&)>& visit, QString* error) const;

    std::deque<core::Event> m_events;
    std::deque<std::size_t> m_stepsBefore;  ///< per event: steps recorded before it
    std::unique_ptr<QTemporaryFile> m_stepFile;
    std::vector<core::StepMetrics> m_memorySteps;  ///< only when the file cannot be written
    std::size_t m_fileSteps = 0;                   ///< steps in the file (they come first)
    std::size_t m_stepCount = 0;
};

}  // namespace batchpilot::ui
