#include "ui/charts/ema.h"

#include <cmath>

namespace batchpilot::ui {

double DebiasedEma::add(double value) {
    if (!std::isfinite(value)) return m_weight > 0 ? m_average / m_weight : value;
    m_average = m_smoothing * m_average + (1.0 - m_smoothing) * value;
    m_weight = m_smoothing * m_weight + (1.0 - m_smoothing);
    return m_average / m_weight;
}

std::vector<QPointF> DebiasedEma::smooth(std::span<const QPointF> raw, double smoothing) {
    DebiasedEma ema(smoothing);
    std::vector<QPointF> out;
    out.reserve(raw.size());
    for (const QPointF& p : raw) out.emplace_back(p.x(), ema.add(p.y()));
    return out;
}

}  // namespace batchpilot::ui
