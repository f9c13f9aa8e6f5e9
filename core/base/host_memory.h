#pragma once

#include <cstdint>

namespace batchpilot::core {

/// The memory this process can ever have on the host: the machine's (MemTotal in /proc/meminfo),
/// or its cgroup's limit where that is lower (memory.max, cgroup v2: a container). 0 when unknown.
int64_t hostMemoryBytes();

/// Memory available now to new allocations without swapping (MemAvailable); 0 when unknown.
int64_t hostAvailableBytes();

}  // namespace batchpilot::core
