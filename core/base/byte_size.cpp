#include "core/base/byte_size.h"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace batchpilot::core {
namespace {

struct Unit {
    std::string_view name;
    double factor;
};

constexpr double kKi = 1024.0;
constexpr std::array<Unit, 13> kUnits{{
    {"", 1.0},
    {"b", 1.0},
    {"k", kKi},
    {"kib", kKi},
    {"kb", 1e3},
    {"m", kKi* kKi},
    {"mib", kKi* kKi},
    {"mb", 1e6},
    {"g", kKi* kKi* kKi},
    {"gib", kKi* kKi* kKi},
    {"gb", 1e9},
    {"tib", kKi* kKi* kKi* kKi},
    {"tb", 1e12},
}};

std::string errorFor(std::string_view text, const char* why) {
    return "invalid memory size \"" + std::string(text) + "\": " + why +
           "; write a number with a unit, e.g. 512MiB, 2GiB, 1.5GB or 800M";
}

}  // namespace

tl::expected<int64_t, std::string> parseByteSize(std::string_view text) {
    std::string_view rest = text;
    while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front()))) {
        rest.remove_prefix(1);
    }
    while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) {
        rest.remove_suffix(1);
    }
    if (rest.empty()) {
        return tl::unexpected(errorFor(text, "it is empty"));
    }
    double value = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
    if (ec != std::errc{} || !std::isfinite(value)) {
        return tl::unexpected(errorFor(text, "it does not start with a number"));
    }
    std::string unit;
    for (const char* c = end; c != rest.data() + rest.size(); ++c) {
        if (!std::isspace(static_cast<unsigned char>(*c))) {
            unit += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
        }
    }
    for (const Unit& candidate : kUnits) {
        if (candidate.name == unit) {
            const double bytes = value * candidate.factor;
            if (bytes < 1.0) {
                return tl::unexpected(errorFor(text, "the size must be at least one byte"));
            }
            if (bytes > 9.0e18) {
                return tl::unexpected(errorFor(text, "the size is too large"));
            }
            return static_cast<int64_t>(std::llround(bytes));
        }
    }
    return tl::unexpected(errorFor(text, "unknown unit"));
}

std::string formatBytes(int64_t bytes) {
    const double magnitude = std::fabs(static_cast<double>(bytes));
    char buffer[32];
    if (magnitude < kKi) {
        std::snprintf(buffer, sizeof buffer, "%lld B", static_cast<long long>(bytes));
    } else if (magnitude < kKi * kKi) {
        std::snprintf(buffer, sizeof buffer, "%.1f KiB", static_cast<double>(bytes) / kKi);
    } else if (magnitude < kKi * kKi * kKi) {
        std::snprintf(buffer, sizeof buffer, "%.1f MiB", static_cast<double>(bytes) / (kKi * kKi));
    } else if (magnitude < kKi * kKi * kKi * kKi) {
        std::snprintf(buffer, sizeof buffer, "%.2f GiB", static_cast<double>(bytes) / (kKi * kKi * kKi));
    } else {
        // Budgets nobody has (virtual:8000000TB) read as TiB, not as "7450580596.92 GiB".
        std::snprintf(buffer, sizeof buffer, "%.2f TiB", static_cast<double>(bytes) / (kKi * kKi * kKi * kKi));
    }
    return buffer;
}

}  // namespace batchpilot::core
