#pragma once

#include <span>
#include <vector>

#include <QPointF>

namespace batchpilot::ui {

/// Exponential moving average with bias correction (as in Adam and TensorBoard): the first values
/// are not pulled toward zero. `smoothing` in [0, 1): 0 returns the raw values, 0.99 is very
/// smooth. Feed raw values, never thinned ones.
class DebiasedEma {
public:
    explicit DebiasedEma(double smoothing = 0.9) : m_smoothing(smoothing) {}

    void reset() {
        m_average = 0;
        m_weight = 0;
    }
    void setSmoothing(double smoothing) {
        m_smoothing = smoothing;
        reset();
    }
    double smoothing() const { return m_smoothing; }
    /// Adds a raw value and returns the debiased average so far.
    double add(double value);

    /// The smoothed series of `raw` (same x values).
    static std::vector<QPointF> smooth(std::span<const QPointF> raw, double smoothing);

private:
    double m_smoothing;
    double m_average = 0;
    double m_weight = 0;  // 1 - smoothing^n, the bias correction
};

}  // namespace batchpilot::ui
