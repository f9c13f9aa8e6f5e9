#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/events/events.h"
#include "core/plan/accumulation_plan.h"
#include "core/plan/probe_search.h"

namespace batchpilot::core {

/// Reading the probe's memory model and the memory breakdown for people: the CLI's
/// --memory-report and the GUI's memory views share this. Torch-free.

/// "≈ 210 MiB fixed + 3.1 MiB per sample" (sizes scaled to their own units).
std::string describeMemoryModel(const MemoryModel& model);

/// What a micro-batch of `microBatch` samples would mean, by the fitted model.
struct WhatIf {
    int64_t microBatch = 0;
    double predictedPeakBytes = 0;
    int64_t accumulationSteps = 0;  ///< micro-batches per training batch of `targetBatch`
    EvenSplit split;                ///< their sizes (differ by at most one), without a list of them
    bool fitsCapacity = false;      ///< predicted peak ≤ capacity
    bool fitsUsable = false;        ///< predicted peak ≤ capacity minus headroom
};
WhatIf predictWhatIf(const MemoryModel& model, int64_t microBatch, int64_t targetBatch, int64_t usableBytes,
                     int64_t capacityBytes);

/// A memory-saver survey as a table: per saver its predicted micro-batch, accumulation steps,
/// samples/s (and against the savers in use), predicted peak and memory line, then the advice.
/// Plain text, one line per row, ends with a newline.
std::string describeSaverSurvey(const SaverSurvey& survey);

/// One line of the breakdown: a part of the device memory.
struct MemoryPart {
    std::string name;  ///< "parameters", "activations (micro-batch 256)", ...
    int64_t bytes = 0;
    std::string explanation;  ///< one sentence for a student
};
/// The parts of a breakdown, in the order they stack: parameters, gradients, optimizer state,
/// activations, other resident (only when the peak holds more than those four), allocator cache,
/// other processes, free; together they make the device's total. Parts that cannot exist on the
/// device (allocator cache, other processes on virtual and cpu) are left out.
std::vector<MemoryPart> memoryParts(const MemoryBreakdown& breakdown);

/// The latest of what a run reported that a report of it needs: the summary, the latest probe
/// (its start, trials and result), memory breakdown, equivalence check, step metrics and state.
/// Feed it every event; the memory report and the desktop app's saved report both read it.
struct RunDigest {
    std::optional<RunSummary> summary;
    std::optional<ProbeStarted> probeStarted;
    std::vector<ProbeTrial> trials;              ///< of the latest probe, in order
    std::optional<ProbeFinished> probeFinished;  ///< of the latest probe (reset when one starts)
    /// The fastest-micro-batch search after the latest probe: the newest timing of each size, in
    /// the order they were timed, and its decision (both reset when a probe starts).
    std::vector<ThroughputTimed> timings;
    std::optional<ThroughputChosen> throughputChosen;
    std::optional<MemoryBreakdown> breakdown;
    std::optional<EquivalenceChecked> equivalence;
    std::optional<ValidationDone> validation;  ///< the latest validation pass
    std::optional<SaverSurvey> saverSurvey;    ///< the latest memory-saver survey
    std::optional<StepMetrics> lastStep;
    std::optional<RunStateChanged> lastState;

    /// Trials kept per probe at most (a probe makes a few dozen).
    static constexpr size_t kMaxTrials = 10'000;

    void handle(const Event& event);
};

/// Collects a run's events and writes the memory report: the probe's trials, the fitted model in
/// words, the chosen micro-batch and its plan, and where the memory goes in the first whole step
/// after the probe (the step the probe ended in also ran its trials). Feed it every event;
/// reportDue() says when a new report is complete: after that step, or when the run ends first.
/// A run without a probe (resumed) reports after its first step.
class MemoryReport {
public:
    void handle(const Event& event);
    /// A report is complete and has not been taken yet.
    bool reportDue() const { return m_due; }
    /// The report text (plain text table, ends with a newline); clears reportDue().
    std::string take();
    /// The report of what has been seen so far (also before reportDue()).
    std::string text() const;

private:
    RunDigest m_digest;
    bool m_probing = false;
    bool m_timing = false;  ///< the fastest-micro-batch search is timing sizes
    bool m_waitingForStep = true;
    int64_t m_reportAfterStep = 1;  ///< the breakdown of this step (or a later one) completes it
    int64_t m_stepsDone = 0;
    bool m_due = false;
};

}  // namespace batchpilot::core
