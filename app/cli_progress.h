#pragma once

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "core/events/events.h"
#include "core/plan/gpu_plan.h"
#include "core/plan/memory_report.h"

namespace batchpilot::core {
class Trainer;
}

namespace batchpilot::app {

/// Prints the run for a person — probe trials, the chosen plan, a progress line per step with
/// loss, samples/s, peak memory and ETA — and writes every event as JSON Lines when asked.
/// On a terminal the step line is rewritten in place; when piped, each step is its own line.
class ConsoleReporter final : public core::EventSink {
public:
    ConsoleReporter(std::FILE* out, bool interactive, bool quiet);

    /// Opens the JSON Lines file; returns false with `error` set when it cannot.
    bool openEvents(const std::string& path, std::string& error);
    /// Flushes and closes the events file; returns what went wrong while writing it (empty: all
    /// written).
    std::string closeEvents();
    /// The trainer to send the equivalence check to (see requestEquivalenceCheck).
    void setTrainer(core::Trainer* trainer) { m_trainer = trainer; }
    /// Prints the memory report (probe trials, memory model, breakdown) after each probe.
    void setMemoryReport(bool on) { m_memoryReport = on; }
    /// After the first probe that fitted a memory line, prints the plan on each of `targets`
    /// (core/plan/gpu_plan.h); `device` is where the run measures, holding `workspaceBytes`.
    void setGpuPlan(std::vector<core::GpuPlanTarget> targets, double headroom, std::string device,
                    int64_t workspaceBytes) {
        m_gpuTargets = std::move(targets);
        m_gpuHeadroom = headroom;
        m_gpuDevice = std::move(device);
        m_gpuWorkspace = workspaceBytes;
    }
    /// The validation metric the run keeps its best model by (--keep-best); the summary's "best"
    /// pass is then the best by it. Empty: by accuracy, then loss.
    void setKeepBest(const std::string& metric) { m_keepBest = metric; }
    /// Several devices: this rank trains a share of each training batch, and its plans say so.
    void setRank(int rank) { m_rank = rank; }
    /// Asks the trainer (set by setTrainer) for an equivalence check of `samples` samples
    /// after the first optimizer step (0: the whole batch), and prints its result.
    void requestEquivalenceCheck(int64_t samples) { m_checkSamples = samples; }
    /// The equivalence check's result, when one ran.
    const core::EquivalenceChecked* equivalence() const { return m_haveEquivalence ? &m_equivalence : nullptr; }

    void onEvent(const core::Event& event) override;

    /// The last step's metrics line, for the final summary.
    const core::StepMetrics& lastStep() const { return m_lastStep; }
    int oomCount() const { return m_ooms; }
    /// Several devices: the OOMs the other ranks reported (RankProbed).
    int otherRankOomCount() const { return m_otherRankOoms; }
    /// The validation results' summary for the end of the run: the last one and the best one
    /// (by accuracy for classification, by loss otherwise); empty when nothing was validated.
    std::string validationSummary() const;

private:
    void line(const std::string& text);
    void printEquivalence(const core::EquivalenceChecked& result);
    // What each event shows (onEvent visits them); an event type not named here shows nothing.
    void on(const core::OptimizerStepped&);
    void on(const core::EquivalenceChecked&);
    void on(const core::RunStateChanged&);
    void on(const core::ProbeStarted&);
    void on(const core::ProbeTrial&);
    void on(const core::ProbeFinished&);
    void on(const core::ThroughputTimed&);
    void on(const core::ThroughputChecked&);
    void on(const core::ThroughputChosen&);
    void on(const core::OomEvent&);
    void on(const core::MicroBatchDone&);
    void on(const core::StepMetrics&);
    void on(const core::RanksStepped&);
    void on(const core::RankProbed&);
    void on(const core::ValidationDone&);
    void on(const core::TargetBatchChanged&);
    void on(const core::DeviceSwitched&);
    void on(const core::SaverSurvey&);
    void on(const core::MemorySaversChanged&);
    void on(const core::LossScaleChanged&);
    void on(const core::CheckpointSaved&);
    void on(const core::Warning&);
    void on(const core::ErrorEvent&);
    template <class Other>
    void on(const Other&) {}

    std::FILE* m_out;
    bool m_interactive;
    bool m_quiet;
    bool m_openLine = false;
    std::ofstream m_events;
    std::string m_eventsPath;
    std::string m_eventsError;  ///< the first write error, reported once
    core::Trainer* m_trainer = nullptr;
    core::StepMetrics m_lastStep;
    std::optional<core::ValidationDone> m_lastValidation;
    std::optional<core::ValidationDone> m_bestValidation;
    std::string m_keepBest;
    std::optional<core::CheckpointSaved> m_bestCheckpoint;  ///< the best model's latest save (--keep-best)
    /// "  val acc 93.1%" (or "  val loss 0.2113") for the step line; empty before a validation.
    std::string lastValidationShort() const;
    int m_ooms = 0;
    bool m_expandableSegments = false;  ///< this process's device's allocator runs with them
    int m_otherRankOoms = 0;
    /// Several devices: the last RanksStepped in words, appended to the step's line.
    std::string m_ranksText;
    std::string m_summedBy;  ///< several devices: what sums the gradients, and why not NCCL (printed when it changes)
    bool m_memoryReport = false;
    int m_rank = -1;  ///< several devices: this process's rank; -1: one device
    /// The micro-batches this process trained in the step under way (MicroBatchDone).
    struct StepTrained {
        int64_t step = 0;
        int64_t microBatches = 0;
        int64_t samples = 0;
        int64_t largest = 0;
    };
    StepTrained m_stepTrained;
    /// What a plan of this process splits: the target batch, or with several devices its share.
    std::string batchName() const;
    core::MemoryReport m_report;
    std::vector<core::GpuPlanTarget> m_gpuTargets;  ///< empty: no plan asked for, or printed already
    double m_gpuHeadroom = 0;
    std::string m_gpuDevice;
    int64_t m_gpuWorkspace = 0;
    int64_t m_checkSamples = -1;
    bool m_checkSent = false;
    core::EquivalenceChecked m_equivalence;
    bool m_haveEquivalence = false;
};

}  // namespace batchpilot::app
