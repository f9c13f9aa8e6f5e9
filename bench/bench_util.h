#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

/// Small helpers shared by the benchmarks: statistics, command-line options, output files and
/// the description of the machine. Torch-free and Qt-free.
namespace batchpilot::bench {

/// Median of `values` (0 when empty).
double median(std::vector<double> values);
/// Nearest-rank percentile `p` in [0, 100] of `values` (0 when empty).
double percentile(std::vector<double> values, double p);

/// Resident set size of this process in bytes (VmRSS), 0 when unreadable.
int64_t residentBytes();

/// Options every benchmark executable takes.
struct BenchArgs {
    std::string outDir = ".";  ///< --out DIR: where the CSV and JSON files go
    bool quick = false;        ///< --quick: fewer repetitions, for trying the benchmark out
};

/// Parses --out DIR and --quick; prints usage and exits on anything else.
BenchArgs parseArgs(int argc, char** argv, const char* name, const char* what);

/// Writes `rows` as CSV with `header` to `<outDir>/<file>`; fields are written as given.
void writeCsv(const std::string& outDir, const std::string& file, const std::string& header,
              const std::vector<std::string>& rows);
/// Writes `value` (pretty-printed) to `<outDir>/<file>`.
void writeJson(const std::string& outDir, const std::string& file, const nlohmann::json& value);

/// Cores, CPU model and memory of this machine, for the report.
nlohmann::json machineDescription();

/// Formats a number for CSV and Markdown with `digits` decimals.
std::string fixed(double value, int digits);

}  // namespace batchpilot::bench
