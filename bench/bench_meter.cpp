// batchpilot-bench-meter: the cost of the memory meter. The same training run with BatchPilot's
// counting allocator installed as LibTorch's CPU allocator (on the cpu device, and on a virtual
// GPU with a budget) against LibTorch's own default CPU allocator, interleaved. Writes
// meter.json and meter.csv.
#include <chrono>
#include <cstdio>
#include <functional>

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include "bench/bench_util.h"
#include "bench/trainer_workload.h"
#include "core/device/counting_allocator.h"
#include "bench/bench_main.h"

namespace bench_meter {

namespace {

using namespace batchpilot;
using Clock = std::chrono::steady_clock;

// The priority installCountingAllocator uses; an equal priority may replace it.
constexpr uint8_t kAllocatorPriority = 100;

struct Variant {
    std::string name;
    std::string device;
    bool counting = true;
};

}  // namespace

int run(int argc, char** argv) {
    const auto args = bench::parseArgs(argc, argv, "batchpilot-bench-meter",
                                       "Counting allocator on against off on the same training run.");
    core::installCountingAllocator();
    const auto started = Clock::now();
    const int reps = args.quick ? 2 : 9;
    const int64_t steps = args.quick ? 3 : 5;
    const std::vector<Variant> variants = {
        {"counting allocator, cpu", "cpu", true},
        {"default allocator, cpu", "cpu", false},
        {"counting allocator, virtual:1GiB/exact", "virtual:1GiB/exact", true},
        {"caching allocator model, virtual:1GiB/caching", "virtual:1GiB/caching", true}};
    std::vector<std::vector<double>> results(variants.size());
    std::vector<double> pairedRatios;
    std::vector<double> pairedCaching;  // the caching model against exact counting, same budget
    std::vector<std::string> rows;
    for (int rep = 0; rep < reps; ++rep) {
        std::vector<double> perRep(variants.size());
        for (size_t j = 0; j < variants.size(); ++j) {
            // Rotate the order so no variant always runs first (or right after another).
            const size_t i = (j + static_cast<size_t>(rep)) % variants.size();
            const Variant& v = variants[i];
            // Swapped only between runs, while no trainer is running: LibTorch's allocator table
            // is not thread-safe. Blocks keep their own deleters, so either allocator frees them.
            c10::SetCPUAllocator(v.counting ? static_cast<c10::Allocator*>(&core::CountingAllocator::instance())
                                            : c10::GetDefaultCPUAllocator(),
                                 kAllocatorPriority);
            perRep[i] = bench::runTrainer(bench::cnnWorkload(v.device, 256, 32, steps)).samplesPerSecond;
            rows.push_back(std::to_string(rep + 1) + ",\"" + v.name + "\"," + bench::fixed(perRep[i], 2));
        }
        c10::SetCPUAllocator(&core::CountingAllocator::instance(), kAllocatorPriority);
        for (size_t i = 0; i < variants.size(); ++i) results[i].push_back(perRep[i]);
        pairedRatios.push_back(perRep[0] / perRep[1]);
        pairedCaching.push_back(perRep[3] / perRep[2]);
        std::printf("rep %d: on %.1f, off %.1f, virtual %.1f, caching model %.1f samples/s\n", rep + 1, perRep[0],
                    perRep[1], perRep[2], perRep[3]);
        std::fflush(stdout);
    }
    nlohmann::json report;
    report["bench"] = "meter";
    report["torch_version"] = TORCH_VERSION;
    report["machine"] = bench::machineDescription();
    report["workload"] = {{"model", "cnn"},    {"input", "3x32x32"},     {"target_batch", 256},
                          {"micro_batch", 32}, {"steps_per_run", steps}, {"repetitions", reps}};
    for (size_t i = 0; i < variants.size(); ++i) {
        report["variants"].push_back({{"name", variants[i].name},
                                      {"device", variants[i].device},
                                      {"counting", variants[i].counting},
                                      {"median_samples_per_s", bench::median(results[i])},
                                      {"runs", results[i]}});
    }
    report["ratio_on_off"] = bench::median(results[0]) / bench::median(results[1]);
    report["ratio_virtual_off"] = bench::median(results[2]) / bench::median(results[1]);
    report["median_paired_ratio_on_off"] = bench::median(pairedRatios);
    report["ratio_caching_exact"] = bench::median(results[3]) / bench::median(results[2]);
    report["median_paired_ratio_caching_exact"] = bench::median(pairedCaching);
    report["seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
    bench::writeJson(args.outDir, "meter.json", report);
    bench::writeCsv(args.outDir, "meter.csv", "rep,variant,samples_per_s", rows);
    std::printf(
        "meter: on/off = %.3f (median of paired ratios %.3f), virtual/off = %.3f, caching model/exact = %.3f "
        "(paired %.3f); %.1f s\n",
        report["ratio_on_off"].get<double>(), bench::median(pairedRatios), report["ratio_virtual_off"].get<double>(),
        report["ratio_caching_exact"].get<double>(), bench::median(pairedCaching), report["seconds"].get<double>());
    return 0;
}

}  // namespace bench_meter

BATCHPILOT_BENCH_MAIN("batchpilot-bench-meter", bench_meter::run)
