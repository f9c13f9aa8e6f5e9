#include "app/serve_address.h"

#include <netdb.h>
#include <netinet/in.h>

#include <cstdlib>
#include <cstring>
#include <memory>

namespace batchpilot::app {

std::pair<std::string, int> numericName(const sockaddr_storage& address, socklen_t length) {
    char host[NI_MAXHOST];
    char port[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof host, port, sizeof port,
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return {std::string(), 0};
    return {std::string(host), std::atoi(port)};
}

bool isLoopbackAddress(const sockaddr_storage& address) {
    if (address.ss_family == AF_INET) {
        const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
        return (ntohl(v4.sin_addr.s_addr) >> 24) == 127;
    }
    if (address.ss_family == AF_INET6) {
        const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(address).sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
        return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
    }
    return false;
}

tl::expected<ListenAddress, std::string> resolveServeHost(const std::string& host, int port, bool anyAddressAllowed) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
    addrinfo* found = nullptr;
    const std::string service = std::to_string(port);
    if (const int error = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); error != 0 || !found)
        return tl::unexpected("--serve: cannot resolve \"" + host + "\" (" + ::gai_strerror(error) +
                              "): give an address of this machine, such as 127.0.0.1");
    const std::unique_ptr<addrinfo, void (*)(addrinfo*)> results(found, ::freeaddrinfo);
    ListenAddress chosen;
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
        if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
        sockaddr_storage address{};
        std::memcpy(&address, a->ai_addr, a->ai_addrlen);
        if (!anyAddressAllowed && !isLoopbackAddress(address)) {
            const std::string numeric = numericName(address, a->ai_addrlen).first;
            return tl::unexpected(
                "--serve " + host + (numeric != host ? " (" + numeric + ")" : std::string()) +
                ": serving on an address other than loopback lets anyone who can reach it watch the run, and with "
                "the control token steer it; the token is its only protection and travels unencrypted. Serve on "
                "loopback (--serve PORT) and reach it through an SSH tunnel (ssh -L PORT:localhost:PORT SERVER), "
                "or add --serve-any-address to accept the risk");
        }
        if (chosen.length == 0) {
            chosen.address = address;
            chosen.length = static_cast<socklen_t>(a->ai_addrlen);
        }
    }
    if (chosen.length == 0) return tl::unexpected("--serve: \"" + host + "\" resolves to no address");
    return chosen;
}

}  // namespace batchpilot::app
