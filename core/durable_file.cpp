#include "core/durable_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

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

}  // namespace batchpilot::core
