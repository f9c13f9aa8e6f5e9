// The main of batchpilot-bench (see bench_main.h).

#include "bench/bench_main.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <string>

namespace batchpilot::bench {
namespace {

std::map<std::string, BenchMain>& registry() {
    static std::map<std::string, BenchMain> benchmarks;
    return benchmarks;
}

}  // namespace

bool registerBenchmark(const char* name, BenchMain run) {
    registry()[name] = run;
    return true;
}

}  // namespace batchpilot::bench

int main(int argc, char** argv) {
    const auto& benchmarks = batchpilot::bench::registry();
    const char* slash = std::strrchr(argv[0], '/');
    const std::string called = slash ? slash + 1 : argv[0];
    // As batchpilot-bench-<name> (the links the build makes), or as batchpilot-bench <name>.
    if (const auto found = benchmarks.find(called); found != benchmarks.end()) return found->second(argc, argv);
    if (argc >= 2) {
        if (const auto found = benchmarks.find("batchpilot-bench-" + std::string(argv[1])); found != benchmarks.end()) {
            argv[1] = argv[0];
            return found->second(argc - 1, argv + 1);
        }
    }
    std::fprintf(stderr,
                 "usage: batchpilot-bench NAME [--out DIR] [--quick] ..., or batchpilot-bench-NAME ...\nnames:");
    for (const auto& [name, run] : benchmarks)
        std::fprintf(stderr, " %s", name.c_str() + std::strlen("batchpilot-bench-"));
    std::fprintf(stderr, "\n");
    return 2;
}
