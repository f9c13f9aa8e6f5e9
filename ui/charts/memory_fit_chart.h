#pragma once

#include <optional>
#include <vector>

#include "core/plan/probe_search.h"
#include "ui/charts/live_chart.h"
#include "ui/charts/what_if_row.h"

class QLabel;
class QLineSeries;
class QScatterSeries;
class QSlider;
class QSpinBox;
class QValueAxis;

namespace batchpilot::ui {

/// Memory against micro-batch for the latest probe: every trial's peak (fits as green circles,
/// fits past the headroom line as amber triangles, out-of-memory trials as red squares at the
/// memory they needed, or at the capacity line when that is unknown), the probe's fitted line
/// peak ≈ fixed + per-sample · n, the capacity and usable (headroom) lines, the chosen
/// micro-batch as a vertical line, and a caption with the fit in words.
///
/// Under it a WhatIfRow: for a micro-batch n it shows the predicted peak, the accumulation plan
/// for the current target batch and whether n fits; n is marked on the chart.
class MemoryFitChart : public LiveChart {
    Q_OBJECT
public:
    explicit MemoryFitChart(QWidget* parent = nullptr);

    void handle(const core::Event& event) override;
    void clear() override;
    QStringList dataSeries() const override {
        return {QStringLiteral("probe_fit_peak_bytes"), QStringLiteral("probe_oom_micro_batch"),
                QStringLiteral("memory_capacity_bytes")};
    }

    /// Trials of the latest probe.
    int trialCount() const { return static_cast<int>(m_trials.size()); }
    /// Points drawn for the trials at the last redraw (fits, past headroom and OOMs together).
    int plottedTrialCount() const;
    /// The memory model the view draws: the probe's, or one fitted to its trials.
    std::optional<core::MemoryModel> memoryModel() const { return m_model; }
    qint64 chosenMicroBatch() const { return m_chosen; }
    qint64 usableBytes() const { return m_usable; }
    qint64 capacityBytes() const { return m_capacity; }
    /// The run's target batch (from the RunModel): the what-if row's plan and the slider's range.
    void setTargetBatch(qint64 target);
    qint64 targetBatch() const { return m_target; }
    QString caption() const;

    /// Moves the what-if slider (and spin box) to `microBatch`.
    void setWhatIf(qint64 microBatch);
    qint64 whatIf() const;
    /// The what-if row: predicted peak, plan, verdict.
    QString whatIfText() const;
    WhatIfRow::Verdict whatIfVerdict() const;
    QSlider* whatIfSlider() const;
    QSpinBox* whatIfBox() const;

protected:
    void refresh(bool follow) override;
    void applyColors(const ChartColors& colors) override;

private:
    struct Trial {
        int trial = 0;
        qint64 microBatch = 0;
        bool fit = false;
        bool withinHeadroom = false;
        qint64 peakBytes = 0;
        qint64 failedBytes = 0;
    };
    /// Where a trial is drawn (MiB); OOMs at the memory they needed, else at the capacity line.
    QPointF pointOf(const Trial& trial) const;
    const Trial* nearestTrial(const QPointF& point) const;
    QString describe(const Trial& trial) const;
    void refitFromTrials();
    void updateRange();
    void updateCaption();
    /// Hands the model and the limits to the what-if row.
    void syncWhatIf();

    int m_sequence = 0;
    qint64 m_upperBound = 0;
    qint64 m_usable = 0;
    qint64 m_capacity = 0;
    qint64 m_target = 0;
    qint64 m_chosen = 0;
    bool m_finished = false;
    bool m_modelFromProbe = false;
    std::optional<core::MemoryModel> m_model;
    std::vector<Trial> m_trials;

    QScatterSeries* m_fits = nullptr;
    QScatterSeries* m_tight = nullptr;
    QScatterSeries* m_ooms = nullptr;
    QLineSeries* m_fitLine = nullptr;
    QLineSeries* m_capacityLine = nullptr;
    QLineSeries* m_usableLine = nullptr;
    QLineSeries* m_chosenLine = nullptr;
    QLineSeries* m_whatIfLine = nullptr;
    QScatterSeries* m_whatIfPoint = nullptr;
    QValueAxis* m_yAxis = nullptr;

    QLabel* m_caption = nullptr;
    WhatIfRow* m_whatIf = nullptr;
};

}  // namespace batchpilot::ui
