#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

namespace batchpilot::core {

/// Parses a memory size such as "512MiB", "2GiB", "1.5GB", "800M" or "1048576" (bytes).
/// Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal units (KB, MB, GB, TB) powers of
/// 1000; a bare K/M/G/T means the binary unit. Case-insensitive, spaces allowed before the unit.
/// Returns a message naming the bad text and the accepted forms when it cannot parse, or when
/// the size is not positive.
tl::expected<int64_t, std::string> parseByteSize(std::string_view text);

/// Formats bytes for people: "512.0 MiB", "1.50 GiB", "12 B".
std::string formatBytes(int64_t bytes);

/// Bytes as MiB (floating point), for tables and charts.
inline double toMiB(int64_t bytes) {
    return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

}  // namespace batchpilot::core
