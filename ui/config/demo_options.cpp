#include "ui/config/demo_options.h"

namespace batchpilot::ui {

core::TrainerOptions demoOptions() {
    core::TrainerOptions o;
    o.model.name = "cnn";
    o.data.name = "synthetic";
    o.data.samples = 8192;
    o.device = "virtual:64MiB";
    o.targetBatch = 1024;
    o.probe.initialMicroBatch = 1;
    o.probe.headroom = 0.05;
    // Adam makes the loss fall visibly within the first minute on two CPU cores.
    o.optimizer.kind = core::OptimizerKind::Adam;
    o.optimizer.learningRate = 0.003;
    o.steps = 400;
    o.seed = 1;
    return o;
}

}  // namespace batchpilot::ui
