#pragma once

#include <optional>
#include <vector>

#include <QString>

#include "core/events.h"

namespace batchpilot::ui {

class ChartsPanel;

/// The latest numbers of the current run that Help > How this works explains: kept up to date
/// from the run's events (cheap: a few fields per event).
struct RunFacts {
    struct Trial {
        qint64 microBatch = 0;
        bool fit = false;
    };
    QString device;
    QString model;
    qint64 parameterCount = 0;
    bool batchStatistics = false;
    qint64 targetBatch = 0;
    std::vector<Trial> trials;                            ///< the latest probe's trials, in order
    qint64 usableBytes = 0;                               ///< the latest probe's usable memory
    std::optional<core::ProbeFinished> probe;             ///< the latest finished probe
    int probes = 0;                                       ///< probes finished in this run
    int trainingOoms = 0;                                 ///< out-of-memory errors while training, all recovered
    qint64 samplesReplayed = 0;                           ///< samples of failed micro-batches run again, smaller
    qint64 steps = 0;                                     ///< optimizer steps done
    std::optional<core::EquivalenceChecked> equivalence;  ///< the latest check

    void handle(const core::Event& event);
    /// True once the run reported anything worth explaining (its summary or a probe).
    bool hasRun() const { return !device.isEmpty() || probe.has_value(); }

private:
    bool m_trialFailed = false;  // a probe trial just failed: its OomEvent is the probe's, not training's
};

/// Help > How this works: probing, accumulation and OOM recovery in plain words (HTML). With a
/// run's facts, every part also says what happened in that run, with its numbers.
QString howItWorksHtml(const RunFacts& facts = {});
/// Help > About (HTML).
QString aboutHtml();
/// Tooltips for a student on the four live charts (charts that already have one keep it).
void explainCharts(ChartsPanel& charts);

}  // namespace batchpilot::ui
