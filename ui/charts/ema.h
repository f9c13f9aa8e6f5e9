#pragma once

#include <span>
#include <vector>

#include <QPointF>

namespace batchpilot::ui {

/// Exponential moving average with bias correction (as in Adam and TensorBoard): the first values
/// are not pulled toward zero. `smoothing` in [0, 1): 0 returns the raw values, 0.99 is very
/// smooth. Feed raw values, never thinned ones.
///
/// add(x, value) weighs by spacing: a point `gap` after the previous one decays the average by
/// smoothing^(gap / mean gap so far) instead of `smoothing`, so evenly spaced points smooth
/// exactly as add(value) does (at any scale of x), and a point after a long pause (a paused run
/// on the wall-time axis, a target batch raised on the samples axis) counts for what that pause
/// means rather than for one step.
class DebiasedEma {
public:
    explicit DebiasedEma(double smoothing = 0.9) : m_smoothing(smoothing) {}

    void reset() {
        m_average = 0;
        m_weight = 0;
        m_points = 0;
        m_gapSum = 0;
    }
    void setSmoothing(double smoothing) {
        m_smoothing = smoothing;
        reset();
    }
    double smoothing() const { return m_smoothing; }
    /// Adds a raw value and returns the debiased average so far.
    double add(double value);
    /// Adds a raw value at `x` (non-decreasing) and returns the debiased average so far, weighed
    /// by spacing.
    double add(double x, double value);

    /// The smoothed series of `raw` (same x values).
    static std::vector<QPointF> smooth(std::span<const QPointF> raw, double smoothing);

private:
    double m_smoothing;
    double m_average = 0;
    double m_weight = 0;  // 1 - smoothing^n, the bias correction
    long long m_points = 0;
    double m_lastX = 0;
    double m_gapSum = 0;
};

}  // namespace batchpilot::ui
