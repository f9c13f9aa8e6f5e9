#pragma once

#include "core/distributed/process_group.h"

// batchpilot-cli --devices A,B,…: one worker process per device, started and supervised here
// (docs/guide/several-devices.md). The workers are this program again, each with --device and
// torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), joining
// through a store this process hosts (TORCHELASTIC_USE_AGENT_STORE=True).

#include <chrono>
#include <string>
#include <vector>

namespace batchpilot::app {

struct LaunchOptions {
    std::vector<std::string> devices;  ///< one rank per device, in rank order
    /// The command line without --devices; each worker gets it with --device added.
    std::vector<std::string> arguments;
    /// --rank-timeout: after a rank failed, the others have this long (at most 10 s) to end.
    std::chrono::seconds rankTimeout{300};
};

/// Runs the job and returns the exit status: 0 when every rank finished, else the status of the
/// first rank that failed (docs/reference/exit-codes.md), 128+N when stopped by signal N.
int launchRanks(const LaunchOptions& options);

/// The command line without --devices and its value (both spellings).
std::vector<std::string> withoutDevicesFlag(const std::vector<std::string>& arguments);

/// The environment variable a worker reads to know that its launcher is alive (it stops when its
/// parent changes: the launcher was killed).
inline constexpr const char* kLauncherVariable = core::kLauncherPidVariable;

}  // namespace batchpilot::app
