#pragma once

#include "core/config/options.h"

namespace batchpilot::ui {

/// The built-in demo: the small CNN on synthetic 3×32×32 images (10 classes), on a virtual GPU
/// whose budget makes the probe run into out-of-memory errors and the target batch need
/// gradient accumulation. `scripts/demo` and `batchpilot --demo` start it.
core::TrainerOptions demoOptions();

}  // namespace batchpilot::ui
