#pragma once

// The benchmarks that include torch are one executable, batchpilot-bench, compiled in unity
// batches (bench/CMakeLists.txt): each translation unit that includes torch costs ~14 s before its
// first line of its own. Each benchmark keeps its name: batchpilot-bench-<name> is a symbolic link
// to batchpilot-bench, which runs the benchmark its own name (or its first argument) says. Each
// file ends with BATCHPILOT_BENCH_MAIN("batchpilot-bench-<name>", its function), and keeps its
// names in its own namespace.

namespace batchpilot::bench {

using BenchMain = int (*)(int argc, char** argv);

/// Makes `run` the main of the benchmark called `name`.
bool registerBenchmark(const char* name, BenchMain run);

}  // namespace batchpilot::bench

#define BATCHPILOT_BENCH_CONCAT_(a, b) a##b
#define BATCHPILOT_BENCH_CONCAT(a, b) BATCHPILOT_BENCH_CONCAT_(a, b)
#define BATCHPILOT_BENCH_MAIN(name, function)                                           \
    static const bool BATCHPILOT_BENCH_CONCAT(batchpilotBenchRegistered, __COUNTER__) = \
        ::batchpilot::bench::registerBenchmark(name, &function);
