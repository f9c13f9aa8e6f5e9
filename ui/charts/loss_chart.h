#pragma once

#include <array>
#include <vector>

#include "ui/charts/ema.h"
#include "ui/charts/live_chart.h"
#include "ui/charts/series_store.h"

class QCheckBox;
class QComboBox;
class QLabel;
class QLineSeries;
class QLogValueAxis;
class QSlider;

namespace batchpilot::ui {

/// Loss per optimizer step: the raw loss drawn faintly, a debiased EMA of it on top (the slider
/// sets the smoothing), the validation loss as marked points (ValidationDone; its tooltip gives
/// the accuracy), a log-scale toggle, and the x axis as step, samples seen or wall time.
class LossChart : public LiveChart {
    Q_OBJECT
public:
    enum class XAxis { Step = 0, Samples = 1, WallTime = 2 };

    explicit LossChart(QWidget* parent = nullptr);

    void handle(const core::Event& event) override;
    bool timeAxis() const override { return m_xKind == XAxis::WallTime; }
    void clear() override;
    QStringList dataSeries() const override {
        return {QStringLiteral("train_loss"),        QStringLiteral("val_loss"), QStringLiteral("val_accuracy"),
                QStringLiteral("val_top5_accuracy"), QStringLiteral("val_mse"),  QStringLiteral("val_mae")};
    }

    void setXAxis(XAxis axis);
    XAxis xAxisKind() const { return m_xKind; }
    /// EMA smoothing in [0, 0.99].
    void setSmoothing(double smoothing);
    double smoothing() const { return m_smoothing; }
    void setLogScale(bool on);
    bool logScale() const { return m_log; }

    /// Raw loss points for the current x axis (full resolution until the store is full).
    const SeriesStore& rawStore() const { return m_raw[static_cast<int>(m_xKind)]; }
    const SeriesStore& smoothedStore() const { return m_smoothed; }
    /// Validation loss points for the current x axis.
    const SeriesStore& validationStore() const { return m_validation[static_cast<int>(m_xKind)]; }
    /// Points currently handed to the drawn series (after thinning).
    int drawnPointCount() const;

protected:
    void refresh(bool follow) override;
    void applyColors(const ChartColors& colors) override;

private:
    void rebuildSmoothed();
    QString xTitle() const;

    std::array<SeriesStore, 3> m_raw;
    std::array<SeriesStore, 3> m_validation;
    std::vector<core::ValidationDone> m_validations;  ///< for the tooltips, in order
    SeriesStore m_smoothed;
    DebiasedEma m_ema;
    XAxis m_xKind = XAxis::Step;
    double m_smoothing = 0.9;
    bool m_log = false;

    QLineSeries* m_rawSeries = nullptr;
    QLineSeries* m_smoothSeries = nullptr;
    QLineSeries* m_validationSeries = nullptr;
    QAbstractAxis* m_yAxis = nullptr;
    QComboBox* m_xCombo = nullptr;
    QSlider* m_slider = nullptr;
    QLabel* m_sliderLabel = nullptr;
    QCheckBox* m_logBox = nullptr;
};

}  // namespace batchpilot::ui
