#include "core/device/math_libraries.h"

#include "core/config/options.h"

#include <link.h>
#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <filesystem>
#include <string_view>
#include <vector>

#include <ATen/Version.h>
#include <torch/version.h>

namespace batchpilot::core {
namespace {

/// Paths of the loaded shared objects whose names look like a BLAS.
std::vector<std::string> loadedBlasLibraries() {
    std::vector<std::string> found;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
            const std::string_view name = info->dlpi_name != nullptr ? info->dlpi_name : "";
            const auto base =
                name.substr(name.find_last_of('/') == std::string_view::npos ? 0 : name.find_last_of('/') + 1);
            if (base.starts_with("libblas.so") || base.starts_with("libopenblas") || base.starts_with("libblis") ||
                base.starts_with("libmkl_rt") || base.starts_with("libcblas.so")) {
                static_cast<std::vector<std::string>*>(out)->emplace_back(name);
            }
            return 0;
        },
        &found);
    return found;
}

/// "BLAS_INFO=mkl" from LibTorch's build configuration.
std::string buildSetting(const std::string& config, const std::string& key) {
    const auto at = config.find(key + "=");
    if (at == std::string::npos) return {};
    const auto start = at + key.size() + 1;
    const auto end = config.find_first_of(", \n", start);
    return config.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

/// OMP_NUM_THREADS as a positive count of at most kMaxThreads, 0 when unset or anything else
/// (OpenMP's lists such as "4,2" name the first level first: that count is taken).
int threadsFromEnvironment() {
    const char* value = std::getenv("OMP_NUM_THREADS");
    if (value == nullptr) return 0;
    int count = 0;
    const char* end = value + std::strlen(value);
    const auto [next, error] = std::from_chars(value, end, count);
    if (error != std::errc{} || next == value || (next != end && *next != ',') || count <= 0) return 0;
    return std::min(count, kMaxThreads);
}

}  // namespace

int intraOpThreadsFor(int requested, int reserved) {
    if (requested > 0) return requested;
    if (const int fromEnvironment = threadsFromEnvironment(); fromEnvironment > 0) return fromEnvironment;
    return std::max(1, cpusAvailable() - std::max(0, reserved));
}

int cpusAvailable() {
    cpu_set_t set;
    CPU_ZERO(&set);
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                           : static_cast<int>(std::thread::hardware_concurrency());
    // A container's quota (cgroup v2's cpu.max, "QUOTA PERIOD" or "max PERIOD"): 2 CPUs' worth
    // on a 64-core host computes as 2, whatever the affinity mask shows.
    if (std::FILE* file = std::fopen("/sys/fs/cgroup/cpu.max", "r")) {
        long long quota = 0;
        long long period = 0;
        if (std::fscanf(file, "%lld %lld", &quota, &period) == 2 && quota > 0 && period > 0)
            cpus = std::min<long long>(cpus, (quota + period - 1) / period);
        std::fclose(file);
    }
    return std::max(1, cpus);
}

MathLibraries mathLibraries(int requestedThreads, int reservedCpus) {
    MathLibraries out;
    out.torchVersion = TORCH_VERSION;
    const std::string config = at::show_config();
    out.torchCuda = buildSetting(config, "USE_CUDA") == "ON" || buildSetting(config, "USE_CUDA") == "1";
    out.intraOpThreads = intraOpThreadsFor(requestedThreads, reservedCpus);
    const std::string built = buildSetting(config, "BLAS_INFO");
    for (const std::string& library : loadedBlasLibraries()) {
        std::error_code ec;
        const std::string resolved = std::filesystem::canonical(library, ec).string();
        const std::string path = ec ? library : resolved;
        out.blasLibrary = path;
        if (path.find("openblas") != std::string::npos) {
            const bool pthreads = path.find("pthread") != std::string::npos;
            const bool openmp = path.find("openmp") != std::string::npos;
            out.blas = std::string("OpenBLAS") + (pthreads ? " (pthreads)" : openmp ? " (OpenMP)" : "");
        } else if (path.find("blis") != std::string::npos) {
            out.blas = std::string("BLIS") + (path.find("pthread") != std::string::npos  ? " (pthreads)"
                                              : path.find("openmp") != std::string::npos ? " (OpenMP)"
                                                                                         : "");
        } else if (path.find("atlas") != std::string::npos) {
            out.blas = "ATLAS";
        } else if (path.find("mkl") != std::string::npos) {
            out.blas = "Intel MKL";
        } else if (path.find("/blas/") != std::string::npos) {
            out.blas = "reference BLAS";
            out.referenceBlas = true;
        } else {
            out.blas = "system BLAS";
        }
        break;
    }
    if (out.blas.empty()) {
        // No BLAS library is loaded: LibTorch carries its own (MKL in PyPI's x86 wheels).
        if (built == "mkl") {
            out.blas = "Intel MKL (in LibTorch)";
        } else if (built.find("open") != std::string::npos) {
            out.blas = "OpenBLAS (in LibTorch)";
        } else {
            out.blas = built.empty() ? "unknown" : built + " (in LibTorch)";
        }
    }
    return out;
}

std::string describe(const MathLibraries& libraries) {
    return "LibTorch " + libraries.torchVersion + (libraries.torchCuda ? " (CUDA)" : " (CPU)") +
           ", BLAS: " + libraries.blas + ", " + std::to_string(libraries.intraOpThreads) + " intra-op thread" +
           (libraries.intraOpThreads == 1 ? "" : "s");
}

std::string referenceBlasWarning(const MathLibraries& libraries) {
    if (!libraries.referenceBlas) return {};
    return "LibTorch is using the reference BLAS (" + libraries.blasLibrary +
           "): linear layers run up to 8x slower than this machine allows; install an optimised one with "
           "`apt-get install libblis4-pthread` (scripts/demo and scripts/test do)";
}

}  // namespace batchpilot::core
