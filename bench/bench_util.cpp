#include "bench/bench_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace batchpilot::bench {

double median(std::vector<double> values) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    const size_t mid = values.size() / 2;
    return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double percentile(std::vector<double> values, double p) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    // Nearest rank: the smallest value with at least p% of the values at or below it.
    const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
    return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

int64_t residentBytes() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmRSS:", 0) == 0) {
            std::istringstream fields(line.substr(6));
            int64_t kib = 0;
            fields >> kib;
            return kib * 1024;
        }
    }
    return 0;
}

BenchArgs parseArgs(int argc, char** argv, const char* name, const char* what) {
    BenchArgs args;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--out" && i + 1 < argc) {
            args.outDir = argv[++i];
        } else if (arg == "--quick") {
            args.quick = true;
        } else {
            std::fprintf(stderr, "usage: %s [--out DIR] [--quick]\n%s\n", name, what);
            std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
        }
    }
    return args;
}

namespace {

std::ofstream openOutput(const std::string& outDir, const std::string& file) {
    std::error_code ignored;  // a failure shows as the file that cannot be opened below
    std::filesystem::create_directories(outDir, ignored);
    const std::string path = outDir + "/" + file;
    std::ofstream out(path);
    if (!out) throw std::runtime_error("cannot write " + path);
    return out;
}

}  // namespace

void writeCsv(const std::string& outDir, const std::string& file, const std::string& header,
              const std::vector<std::string>& rows) {
    std::ofstream out = openOutput(outDir, file);
    out << header << '\n';
    for (const std::string& row : rows) out << row << '\n';
}

void writeJson(const std::string& outDir, const std::string& file, const nlohmann::json& value) {
    std::ofstream out = openOutput(outDir, file);
    out << value.dump(2) << '\n';
}

nlohmann::json machineDescription() {
    nlohmann::json machine;
    machine["cores"] = std::thread::hardware_concurrency();
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            machine["cpu"] = colon == std::string::npos ? line : line.substr(colon + 2);
            break;
        }
    }
    std::ifstream meminfo("/proc/meminfo");
    std::string key, unit;
    int64_t kib = 0;
    while (meminfo >> key >> kib >> unit) {
        if (key == "MemTotal:") {
            machine["memory_bytes"] = kib * 1024;
            break;
        }
    }
    return machine;
}

std::string fixed(double value, int digits) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
    return buffer;
}

}  // namespace batchpilot::bench
