#pragma once

#include <string_view>

namespace batchpilot::core {

/// For tests that kill the process at a chosen moment (tests/app/tst_cli.cpp kills the CLI with
/// SIGKILL during a probe, between two micro-batches of a training batch and while a checkpoint
/// is half written, then resumes): BATCHPILOT_HOLD_AT="POINT:N" stops the calling thread for good
/// the N-th time it reaches the point named POINT, after writing "held at POINT N" to standard
/// error. Points: "probe-trial" (after a probe trial that fitted), "micro-batch" (after a
/// micro-batch that is not its training batch's last), "checkpoint-write" (half of
/// checkpoint.pt's temporary file written). Without the variable it returns at once; the
/// variable is read once.
/// Thread rules: any thread.
void holdPoint(std::string_view point);

}  // namespace batchpilot::core
