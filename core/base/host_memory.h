#pragma once

#include <cstdint>

namespace batchpilot::core {

/// The memory this process can ever have on the host: the machine's (MemTotal in /proc/meminfo),
/// or its cgroup's limit where that is lower (memory.max, cgroup v2: a container). 0 when unknown.
int64_t hostMemoryBytes();

/// Memory available now to new allocations without swapping (MemAvailable); 0 when unknown.
int64_t hostAvailableBytes();

/// Keeps freed host memory for reuse (glibc's malloc settings; core/base/host_memory.cpp says why
/// and what it costs). Once per process; installCountingAllocator() calls it. A program whose
/// threads train (the window) calls it first thing in main(), before any thread allocates: a
/// thread that allocated before it keeps an arena of its own.
void keepFreedHostMemory();

}  // namespace batchpilot::core
