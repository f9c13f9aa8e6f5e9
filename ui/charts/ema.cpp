#include "ui/charts/ema.h"

#include <algorithm>
#include <cmath>

namespace batchpilot::ui {

double DebiasedEma::add(double value) {
    if (!std::isfinite(value)) return m_weight > 0 ? m_average / m_weight : value;
    m_average = m_smoothing * m_average + (1.0 - m_smoothing) * value;
    m_weight = m_smoothing * m_weight + (1.0 - m_smoothing);
    return m_average / m_weight;
}

double DebiasedEma::add(double x, double value) {
    if (!std::isfinite(value) || !std::isfinite(x)) return m_weight > 0 ? m_average / m_weight : value;
    double decay = m_smoothing;
    if (m_points > 0) {
        const double gap = std::max(0.0, x - m_lastX);
        m_gapSum += gap;
        const double unit = m_gapSum / static_cast<double>(m_points);
        // Points at the same x (or smoothing 0) decay as one step does.
        if (gap > 0 && unit > 0 && m_smoothing > 0) decay = std::pow(m_smoothing, gap / unit);
    }
    m_lastX = x;
    ++m_points;
    m_average = decay * m_average + (1.0 - decay) * value;
    m_weight = decay * m_weight + (1.0 - decay);
    return m_weight > 0 ? m_average / m_weight : value;
}

std::vector<QPointF> DebiasedEma::smooth(std::span<const QPointF> raw, double smoothing) {
    DebiasedEma ema(smoothing);
    std::vector<QPointF> out;
    out.reserve(raw.size());
    for (const QPointF& p : raw) out.emplace_back(p.x(), ema.add(p.y()));
    return out;
}

}  // namespace batchpilot::ui
