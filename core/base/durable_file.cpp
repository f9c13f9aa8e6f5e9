#include "core/base/durable_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace batchpilot::core {

tl::expected<void, std::string> writeAllAndSync(int fd, std::initializer_list<std::string_view> parts) {
    for (std::string_view part : parts) {
        for (size_t done = 0; done < part.size();) {
            const ssize_t n = ::write(fd, part.data() + done, part.size() - done);
            if (n > 0) {
                done += static_cast<size_t>(n);
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else {
                return tl::unexpected(n < 0 ? std::string(std::strerror(errno)) : std::string("short write"));
            }
        }
    }
    if (::fsync(fd) != 0) return tl::unexpected(std::string(std::strerror(errno)));
    return {};
}

tl::expected<void, std::string> replaceFileAtomically(const std::string& path, std::string_view text,
                                                      const std::string& named) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto status = fs::symlink_status(path, ec);
    if (!ec && fs::exists(status) && !fs::is_regular_file(status)) {
        return tl::unexpected("not writing " + named + ": the path is " +
                              (fs::is_symlink(status)     ? std::string("a symbolic link")
                               : fs::is_directory(status) ? std::string("a folder")
                                                          : std::string("a FIFO, socket or device")) +
                              ", and only a regular file is replaced; choose another path");
    }
    const fs::path target(path);
    const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
    std::string temporary = (folder / ("." + target.filename().string() + ".XXXXXX")).string();
    const int fd = ::mkstemp(temporary.data());
    if (fd < 0) return tl::unexpected("cannot write " + named + ": check the folder exists and is writable");
    const auto written = writeAllAndSync(fd, {text});
    const bool closed = ::close(fd) == 0;
    if (!written || !closed) {
        std::remove(temporary.c_str());
        return tl::unexpected("writing " + named + " failed (disk full?); the previous file, if any, is unchanged");
    }
    ::chmod(temporary.c_str(), 0644);
    if (std::rename(temporary.c_str(), path.c_str()) != 0) {
        std::remove(temporary.c_str());
        return tl::unexpected("cannot replace " + named);
    }
    return {};
}

}  // namespace batchpilot::core
