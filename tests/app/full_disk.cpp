// A disk that fills up, for tests: preloaded into a process (LD_PRELOAD), it lets writes to files
// inside the folder BATCHPILOT_FULL_DISK_DIR add up to BATCHPILOT_FULL_DISK_BYTES bytes in all;
// the write that would pass that limit writes what still fits and the next fails with ENOSPC
// ("No space left on device"), as a full file system answers. Bytes are counted as written,
// never given back (a file removed or replaced does not free space here). Other files are
// written as usual. Used by tests/app/tst_cli.cpp (diskFillsDuringTheRun).

#include <dlfcn.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using WriteFn = ssize_t (*)(int, const void*, size_t);
using WritevFn = ssize_t (*)(int, const struct iovec*, int);
using PwriteFn = ssize_t (*)(int, const void*, size_t, off_t);

std::atomic<long long> g_written{0};

const std::string& fullFolder() {
    static const std::string folder = [] {
        const char* value = std::getenv("BATCHPILOT_FULL_DISK_DIR");
        return value != nullptr ? std::string(value) + "/" : std::string();
    }();
    return folder;
}

long long capacity() {
    static const long long bytes = [] {
        const char* value = std::getenv("BATCHPILOT_FULL_DISK_BYTES");
        return value != nullptr ? std::atoll(value) : LLONG_MAX;
    }();
    return bytes;
}

bool onFullDisk(int fd) {
    if (fullFolder().empty() || fd <= STDERR_FILENO) return false;
    char link[64];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    char path[PATH_MAX];
    const ssize_t n = ::readlink(link, path, sizeof path - 1);
    if (n <= 0) return false;
    return std::string(path, size_t(n)).rfind(fullFolder(), 0) == 0;
}

/// How many of `wanted` bytes fit; -1 with errno ENOSPC when none do.
ssize_t admit(size_t wanted) {
    long long before = g_written.load();
    for (;;) {
        const long long room = capacity() - before;
        if (room <= 0) {
            errno = ENOSPC;
            return -1;
        }
        const long long granted = std::min<long long>(room, static_cast<long long>(wanted));
        if (g_written.compare_exchange_weak(before, before + granted)) return static_cast<ssize_t>(granted);
    }
}

template <typename Fn>
Fn next(const char* name) {
    return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" ssize_t write(int fd, const void* data, size_t count) {
    static const auto real = next<WriteFn>("write");
    if (count == 0 || !onFullDisk(fd)) return real(fd, data, count);
    const ssize_t granted = admit(count);
    return granted < 0 ? -1 : real(fd, data, static_cast<size_t>(granted));
}

extern "C" ssize_t pwrite(int fd, const void* data, size_t count, off_t offset) {
    static const auto real = next<PwriteFn>("pwrite");
    if (count == 0 || !onFullDisk(fd)) return real(fd, data, count, offset);
    const ssize_t granted = admit(count);
    return granted < 0 ? -1 : real(fd, data, static_cast<size_t>(granted), offset);
}

extern "C" ssize_t writev(int fd, const struct iovec* parts, int count) {
    static const auto real = next<WritevFn>("writev");
    if (count <= 0 || !onFullDisk(fd)) return real(fd, parts, count);
    // The first part only, as much of it as fits: a short write, which writers retry.
    for (int i = 0; i < count; ++i) {
        if (parts[i].iov_len == 0) continue;
        const ssize_t granted = admit(parts[i].iov_len);
        if (granted < 0) return -1;
        static const auto realWrite = next<WriteFn>("write");
        return realWrite(fd, parts[i].iov_base, static_cast<size_t>(granted));
    }
    return 0;
}
