#include "core/base/host_memory.h"

#include <cstdio>
#include <cstring>

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

}  // namespace batchpilot::core
