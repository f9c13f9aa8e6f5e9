#include "core/plan/loss_scaler.h"

namespace batchpilot::core {

std::optional<LossScaler::Change> LossScaler::overflowed() {
    const double lower = m_scale / 2;
    if (lower < kMinLossScale) return std::nullopt;
    const Change change{m_scale, lower};
    m_scale = lower;
    m_cleanSteps = 0;
    return change;
}

std::optional<LossScaler::Change> LossScaler::stepped() {
    if (++m_cleanSteps < m_growthSteps || m_scale * 2 > kMaxLossScale) return std::nullopt;
    const Change change{m_scale, m_scale * 2};
    m_scale *= 2;
    m_cleanSteps = 0;
    return change;
}

void LossScaler::resume(double scale) {
    if (scale > 0) m_scale = scale;
}

}  // namespace batchpilot::core
