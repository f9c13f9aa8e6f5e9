#pragma once

#include <cstdint>
#include <optional>

#include "core/config/memory_savers.h"
#include "core/config/options.h"

namespace batchpilot::core {

/// float16 autocast's loss scale, by the rule of PyTorch's GradScaler (torch/amp/grad_scaler.py,
/// `_amp_update_scale_`): backward runs on the loss times scale(); gradients that overflow halve
/// it (GradScaler's backoff factor 0.5) and restart the count, and `growthSteps` clean steps in a
/// row double it (its growth factor 2, interval 2000). Where GradScaler skips the step that
/// overflowed, BatchPilot trains the same batch again at the lower scale, so no sample is lost.
/// Bounded: it never grows past kMaxLossScale, and an overflow at kMinLossScale ends the run (the
/// gradients are not finite even unscaled).
class LossScaler {
public:
    /// A change of the scale, for the run's events.
    struct Change {
        double from = 0;
        double to = 0;
    };

    explicit LossScaler(double initial = 1, int64_t growthSteps = kLossScaleGrowthSteps)
        : m_scale(initial), m_growthSteps(growthSteps) {}

    double scale() const { return m_scale; }

    /// The gradients overflowed: the scale halves. Nullopt, the scale unchanged, when that would
    /// take it below kMinLossScale.
    std::optional<Change> overflowed();
    /// A step without overflow: the change when the scale grows now.
    std::optional<Change> stepped();
    /// A resumed run goes on at the scale its checkpoint recorded (ignored when not positive).
    void resume(double scale);

private:
    double m_scale;
    int64_t m_growthSteps;
    int64_t m_cleanSteps = 0;
};

}  // namespace batchpilot::core
