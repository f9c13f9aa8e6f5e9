#pragma once
// Shared by the libFuzzer harnesses: the readers under test take file paths, so each input is
// written to a file in a private scratch folder (on /dev/shm where there is one: no disk I/O).

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace batchpilot::fuzz {

/// A folder of this process's own, removed when the process ends normally.
inline const std::filesystem::path& scratch() {
    struct Folder {
        std::filesystem::path path;
        Folder() {
            std::string base = std::filesystem::is_directory("/dev/shm")
                                   ? "/dev/shm"
                                   : std::filesystem::temp_directory_path().string();
            std::string pattern = base + "/batchpilot-fuzz-XXXXXX";
            if (mkdtemp(pattern.data()) == nullptr) std::abort();
            path = pattern;
        }
        ~Folder() {
            std::error_code ec;
            std::filesystem::remove_all(path, ec);
        }
    };
    static Folder folder;
    return folder.path;
}

/// An empty folder `name` inside the scratch folder (emptied if it was used before).
inline std::filesystem::path freshFolder(const std::string& name) {
    const std::filesystem::path folder = scratch() / name;
    std::error_code ec;
    std::filesystem::remove_all(folder, ec);
    std::filesystem::create_directories(folder);
    return folder;
}

inline void writeFile(const std::filesystem::path& path, std::string_view bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) std::abort();  // the scratch folder is full: not a finding, stop loudly
}

inline std::string_view asText(const uint8_t* data, size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}

}  // namespace batchpilot::fuzz
