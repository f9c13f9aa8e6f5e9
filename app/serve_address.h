#pragma once

// Where `--serve` listens: the address a host name resolves to, checked to be loopback unless the
// user accepts serving beyond this machine.

#include <sys/socket.h>

#include <string>
#include <utility>

#include <tl/expected.hpp>

namespace batchpilot::app {

/// Where a gate listens: a numeric address, as resolveServeHost gives it.
struct ListenAddress {
    sockaddr_storage address{};
    socklen_t length = 0;
};

/// Resolves `host` (a name or a numeric address) to the address to listen on. Unless
/// `anyAddressAllowed`, every address it resolves to must be a loopback one (127.0.0.0/8, ::1,
/// or ::ffff:127.x): the check reads the address, never the name.
tl::expected<ListenAddress, std::string> resolveServeHost(const std::string& host, int port, bool anyAddressAllowed);
/// Whether `address` is a loopback address (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104).
bool isLoopbackAddress(const sockaddr_storage& address);

/// Address and port in numeric form ("127.0.0.1", 8080), as httplib gives Request::remote_addr.
std::pair<std::string, int> numericName(const sockaddr_storage& address, socklen_t length);

}  // namespace batchpilot::app
