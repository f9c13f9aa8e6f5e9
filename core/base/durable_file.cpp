#include "core/base/durable_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace batchpilot::core {

tl::expected<void, std::string> writeAll(int fd, std::initializer_list<std::string_view> parts) {
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
    return {};
}

tl::expected<void, std::string> writeAllAndSync(int fd, std::initializer_list<std::string_view> parts) {
    if (auto written = writeAll(fd, parts); !written) return written;
    if (::fsync(fd) != 0) return tl::unexpected(std::string(std::strerror(errno)));
    return {};
}

namespace {

/// "a symbolic link", "a folder", ...: what stands at a path that is not a regular file.
std::string kindOf(const std::filesystem::file_status& status) {
    namespace fs = std::filesystem;
    if (fs::is_symlink(status)) return "a symbolic link";
    if (fs::is_directory(status)) return "a folder";
    if (fs::is_fifo(status)) return "a FIFO (named pipe)";
    if (fs::is_socket(status)) return "a socket";
    if (fs::is_character_file(status) || fs::is_block_file(status)) return "a device";
    return "not a regular file";
}

}  // namespace

std::string whyNotWritable(const std::string& path, const std::string& named) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto status = fs::symlink_status(path, ec);
    if (ec || !fs::exists(status) || fs::is_regular_file(status)) return {};
    return "not writing " + named + ": the path is " + kindOf(status) +
           ", and only a regular file is replaced (or a new one made); choose another path";
}

tl::expected<void, std::string> replaceFileAtomically(const std::string& path, std::string_view text,
                                                      const std::string& named) {
    namespace fs = std::filesystem;
    if (std::string why = whyNotWritable(path, named); !why.empty()) return tl::unexpected(std::move(why));
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
