#pragma once

#include "ui/charts/live_chart.h"
#include "ui/charts/series_store.h"

class QLineSeries;
class QValueAxis;

namespace batchpilot::ui {

/// Throughput (samples per second, left axis) and the plan in use — micro-batch size and
/// accumulation steps (right axis) — per optimizer step, against wall time.
class ThroughputChart : public LiveChart {
    Q_OBJECT
public:
    explicit ThroughputChart(QWidget* parent = nullptr);

    bool timeAxis() const override { return true; }
    void handle(const core::Event& event) override;
    void clear() override;
    QStringList dataSeries() const override {
        return {QStringLiteral("samples_per_second"), QStringLiteral("micro_batch"),
                QStringLiteral("accumulation_steps"), QStringLiteral("target_batch")};
    }

    const SeriesStore& throughputStore() const { return m_throughput; }
    /// Samples per second per unit of the left axis: 1, or 1000 once the run's rate reaches 1000
    /// (labels "1k", "2k" on whole thousands: at 1280x800 Qt cut labels like "1500" to "1…").
    double rateUnit() const { return m_rateUnit; }
    QValueAxis* rateAxis() const { return m_rateAxis; }
    const SeriesStore& microBatchStore() const { return m_microBatch; }

protected:
    void refresh(bool follow) override;
    void applyColors(const ChartColors& colors) override;

private:
    SeriesStore m_throughput;
    SeriesStore m_microBatch;
    SeriesStore m_accumulation;
    QLineSeries* m_throughputSeries = nullptr;
    QLineSeries* m_microBatchSeries = nullptr;
    QLineSeries* m_accumulationSeries = nullptr;
    QValueAxis* m_rateAxis = nullptr;
    double m_rateUnit = 1;
    QValueAxis* m_planAxis = nullptr;   ///< micro-batch size (samples)
    QValueAxis* m_stepsAxis = nullptr;  ///< accumulation steps: its own scale (a few, next to hundreds of samples)
};

}  // namespace batchpilot::ui
