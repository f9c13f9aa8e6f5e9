#pragma once

#include <vector>

#include <QString>

#include "ui/charts/live_chart.h"

class QLabel;
class QLineSeries;
class QScatterSeries;
class QValueAxis;

namespace batchpilot::ui {

/// The fastest-micro-batch search (objective "fastest"): samples per second against micro-batch
/// size for each size the latest search timed on training micro-batches, the largest size that
/// fits as a dashed line, and the chosen size as a larger marker. The caption says what was
/// chosen and why it is not the largest that fits. A new probe starts a new search.
class SpeedChart : public LiveChart {
    Q_OBJECT
public:
    explicit SpeedChart(QWidget* parent = nullptr);

    void handle(const core::Event& event) override;
    void clear() override;
    QStringList dataSeries() const override { return {QStringLiteral("timed_samples_per_second")}; }

    struct Candidate {
        qint64 microBatch = 0;
        double samplesPerSecond = 0;  ///< median of the counted timings, 0 while warming up
        int repetitions = 0;
    };
    /// The latest search's sizes, in the order they were timed.
    const std::vector<Candidate>& candidates() const { return m_candidates; }
    qint64 chosenMicroBatch() const { return m_chosen; }
    qint64 largestMicroBatch() const { return m_largest; }
    /// What the chart says under its title ("chose 128: …" or what it is doing).
    QString caption() const;

protected:
    void refresh(bool follow) override;
    void applyColors(const ChartColors& colors) override;

private:
    void updateCaption();

    std::vector<Candidate> m_candidates;
    qint64 m_largest = 0;  ///< the latest probe's result, 0 before
    qint64 m_chosen = 0;   ///< 0 until the search decided
    QString m_reason;
    bool m_largestObjective = false;  ///< the probe finished and no timing followed (yet)

    QLineSeries* m_line = nullptr;
    QScatterSeries* m_points = nullptr;
    QScatterSeries* m_chosenPoint = nullptr;
    QLineSeries* m_largestLine = nullptr;
    QValueAxis* m_rateAxis = nullptr;
    QLabel* m_caption = nullptr;
};

}  // namespace batchpilot::ui
