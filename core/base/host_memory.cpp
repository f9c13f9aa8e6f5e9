#include "core/base/host_memory.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace batchpilot::core {
namespace {

/// The value of `key` ("MemTotal:") in /proc/meminfo, in bytes; 0 when absent.
int64_t meminfo(const char* key) {
    std::FILE* file = std::fopen("/proc/meminfo", "r");
    if (file == nullptr) return 0;
    char line[256];
    int64_t bytes = 0;
    const size_t length = std::strlen(key);
    while (std::fgets(line, sizeof line, file) != nullptr) {
        long long kib = 0;
        if (std::strncmp(line, key, length) == 0 && std::sscanf(line + length, " %lld kB", &kib) == 1) {
            bytes = static_cast<int64_t>(kib) * 1024;
            break;
        }
    }
    std::fclose(file);
    return bytes;
}

/// The cgroup v2 memory limit of this process; 0 when there is none ("max") or it is unknown.
int64_t cgroupLimit() {
    std::FILE* file = std::fopen("/sys/fs/cgroup/memory.max", "r");
    if (file == nullptr) return 0;
    long long bytes = 0;
    const bool read = std::fscanf(file, "%lld", &bytes) == 1;
    std::fclose(file);
    return read && bytes > 0 ? static_cast<int64_t>(bytes) : 0;
}

}  // namespace

int64_t hostMemoryBytes() {
    const int64_t total = meminfo("MemTotal:");
    const int64_t limit = cgroupLimit();
    if (total <= 0) return limit;
    return limit > 0 && limit < total ? limit : total;
}

int64_t hostAvailableBytes() {
    return meminfo("MemAvailable:");
}

/// glibc hands freed blocks of more than 128 KiB back to the system (it trims the heap and unmaps
/// large blocks) and faults them in again, zeroed, at the next micro-batch. Measured here (cnn,
/// target 1024, Adam, 2 threads): micro-batch 1024 ran at 1,162 samples/s with 5.6 s of system
/// time in 8 steps, 2,230 samples/s with 1.9 s when freed memory is kept. So freed host memory is
/// kept for reuse, as LibTorch's CUDA caching allocator keeps device memory: the heap is not
/// trimmed, and blocks up to 1 GiB come from it. A threshold of 32 MiB, glibc's own ceiling for
/// the threshold it raises by itself, left the activations of a 224x224 ResNet (100 MiB and more
/// at micro-batch 32) mapped afresh at every micro-batch: half its time in the kernel, 80
/// samples/s where 1 GiB gives 140-180, and a speed that depended on which sizes ran before in
/// the process. A glibc that refuses 1 GiB gets 32 MiB. And every thread allocates from the main
/// arena: a thread that allocates gets an arena of its own otherwise, made of heaps of at most
/// 64 MiB, where a larger block is mapped afresh whatever the threshold (a 100 MiB block touched
/// again on the window's trainer thread: 25,600 page faults, 0 with one arena). The threads then
/// share the arena's lock for blocks above glibc's per-thread cache (1 KiB). Malloc settings a
/// user gives in GLIBC_TUNABLES win.
void keepFreedHostMemory() {
#if defined(__GLIBC__)
    static std::once_flag once;
    std::call_once(once, [] {
        const char* tunables = std::getenv("GLIBC_TUNABLES");
        if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return;
        if (mallopt(M_MMAP_THRESHOLD, 1 << 30) != 1) mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
        mallopt(M_TRIM_THRESHOLD, INT_MAX);
        mallopt(M_ARENA_MAX, 1);
    });
#endif
}

}  // namespace batchpilot::core
