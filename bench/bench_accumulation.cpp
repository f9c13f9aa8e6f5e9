// batchpilot-bench-accumulation: BatchPilot's trainer (probe finished, accumulation active,
// every event stored) against a bare LibTorch loop on the same model, micro-batch and data,
// interleaved; then samples/s over micro-batches 1, 2, 4, … up to the largest that fits, at a
// fixed target batch. Writes accumulation.json, accumulation.csv and microbatch_sweep.csv.
#include <chrono>
#include <cstdio>

#include <torch/version.h>

#include "bench/bench_util.h"
#include "bench/trainer_workload.h"
#include "core/plan/accumulation_plan.h"
#include "core/device/counting_allocator.h"
#include "core/data/dataset.h"
#include "core/device/device.h"
#include "core/nn/model.h"
#include "core/data/sampler.h"
#include "bench/bench_main.h"

namespace bench_accumulation {

namespace {

using namespace batchpilot;
using Clock = std::chrono::steady_clock;

constexpr int64_t kTarget = 256;
constexpr int64_t kMicroBatch = 32;
/// A virtual GPU on which the CNN's largest micro-batch is well below the target batch.
constexpr const char* kDevice = "virtual:40MiB/exact";

/// The loop a user writes without BatchPilot: forward, loss scaled by n_i / T, backward into
/// .grad, one optimizer step every k micro-batches. Same model, seed, data order, micro-batch
/// split and device (the same counting allocator and budget) as the trainer. Returns samples/s
/// over steps 2..N.
double bareLoop(const core::TrainerOptions& o) {
    core::CountingScope counting(true);
    const auto meter = core::openMeter(*core::parseDevice(o.device));
    std::shared_ptr<core::Dataset> data;
    {
        core::CountingScope host(false);
        data = *core::makeDataset(o.data);
    }
    torch::manual_seed(static_cast<uint64_t>(o.seed));
    auto model = *core::makeBuiltinModel(o.model, data->sampleShape(), data->classes());
    model->train(true);
    auto parameters = model->parameters();
    torch::optim::SGD optimizer(parameters,
                                torch::optim::SGDOptions(o.optimizer.learningRate).momentum(o.optimizer.momentum));
    core::Sampler sampler(data->size(), o.seed);
    Clock::time_point firstEnd;
    for (int64_t step = 1; step <= o.steps.value(); ++step) {
        const std::vector<int64_t> indices = sampler.next(o.targetBatch);
        const core::AccumulationPlan plan(static_cast<int64_t>(indices.size()), o.probe.maxMicroBatch);
        for (int64_t i = 0; i < plan.steps(); ++i) {
            const auto begin = indices.begin() + plan.offset(i);
            const std::vector<int64_t> slice(begin, begin + plan.sizes()[static_cast<size_t>(i)]);
            core::Batch batch;
            {
                core::CountingScope host(false);
                batch = data->get(slice);
            }
            auto loss = torch::nn::functional::cross_entropy(model->forward(batch.inputs), batch.targets);
            (loss * plan.weight(i)).backward();
        }
        optimizer.step();
        optimizer.zero_grad();
        if (step == 1) firstEnd = Clock::now();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - firstEnd).count();
    return static_cast<double>((o.steps.value() - 1) * o.targetBatch) / seconds;
}

}  // namespace

int run(int argc, char** argv) {
    const auto args = bench::parseArgs(argc, argv, "batchpilot-bench-accumulation",
                                       "Trainer against a bare LibTorch loop; samples/s over micro-batch sizes.");
    core::installCountingAllocator();
    const auto started = Clock::now();
    const int reps = args.quick ? 2 : 7;
    const int64_t steps = args.quick ? 3 : 9;
    const core::TrainerOptions options = bench::cnnWorkload(kDevice, kTarget, kMicroBatch, steps);

    // Part 1: interleaved repetitions, alternating which variant goes first.
    std::vector<double> trainer, bare, ratios;
    std::vector<std::string> rows;
    int64_t events = 0, accumulation = 0;
    for (int rep = 0; rep < reps; ++rep) {
        double t = 0, b = 0;
        if (rep % 2 == 0) {
            const auto r = bench::runTrainer(options);
            t = r.samplesPerSecond;
            events = r.events;
            accumulation = r.accumulationSteps;
            b = bareLoop(options);
        } else {
            b = bareLoop(options);
            t = bench::runTrainer(options).samplesPerSecond;
        }
        trainer.push_back(t);
        bare.push_back(b);
        ratios.push_back(t / b);
        rows.push_back(std::to_string(rep + 1) + "," + bench::fixed(t, 2) + "," + bench::fixed(b, 2) + "," +
                       bench::fixed(t / b, 4));
        std::printf("rep %d: trainer %.1f samples/s, bare loop %.1f samples/s, ratio %.3f\n", rep + 1, t, b, t / b);
        std::fflush(stdout);
    }

    // Part 2: micro-batch sweep at the same target batch; the last size is the probe's choice.
    // The probe's trials take the first training batches; a few steps let it finish.
    const int64_t probed = bench::runTrainer(bench::cnnWorkload(kDevice, kTarget, 0, 6)).microBatch;
    if (probed <= 0) {
        std::fprintf(stderr, "batchpilot-bench-accumulation: the probe did not finish in 6 steps\n");
        return 1;
    }
    std::vector<int64_t> sizes;
    for (int64_t m = 1; m < probed; m *= 2) sizes.push_back(m);
    sizes.push_back(probed);
    const int sweepReps = args.quick ? 1 : 3;
    std::vector<std::vector<double>> sweep(sizes.size());
    for (int rep = 0; rep < sweepReps; ++rep) {
        for (size_t i = 0; i < sizes.size(); ++i) {
            sweep[i].push_back(bench::runTrainer(bench::cnnWorkload(kDevice, kTarget, sizes[i], 3)).samplesPerSecond);
        }
    }
    nlohmann::json report;
    report["bench"] = "accumulation";
    report["torch_version"] = TORCH_VERSION;
    report["machine"] = bench::machineDescription();
    report["workload"] = {{"model", "cnn"},
                          {"width", options.model.width},
                          {"input", "3x32x32"},
                          {"device", kDevice},
                          {"target_batch", kTarget},
                          {"micro_batch", kMicroBatch},
                          {"accumulation_steps", accumulation},
                          {"steps_per_run", steps},
                          {"repetitions", reps},
                          {"events_stored_per_run", events}};
    report["trainer_samples_per_s"] = trainer;
    report["bare_samples_per_s"] = bare;
    report["trainer_median"] = bench::median(trainer);
    report["bare_median"] = bench::median(bare);
    report["ratio_of_medians"] = bench::median(trainer) / bench::median(bare);
    report["median_paired_ratio"] = bench::median(ratios);
    report["probed_micro_batch"] = probed;
    std::vector<std::string> sweepRows;
    const double base = bench::median(sweep.front());
    for (size_t i = 0; i < sizes.size(); ++i) {
        const double value = bench::median(sweep[i]);
        report["sweep"].push_back({{"micro_batch", sizes[i]},
                                   {"accumulation_steps", core::AccumulationPlan(kTarget, sizes[i]).steps()},
                                   {"samples_per_s", value},
                                   {"speedup_vs_1", value / base},
                                   {"runs", sweep[i]}});
        sweepRows.push_back(std::to_string(sizes[i]) + "," +
                            std::to_string(core::AccumulationPlan(kTarget, sizes[i]).steps()) + "," +
                            bench::fixed(value, 2) + "," + bench::fixed(value / base, 2));
        std::printf("micro-batch %4lld: %.1f samples/s\n", static_cast<long long>(sizes[i]), value);
    }
    report["seconds"] = std::chrono::duration<double>(Clock::now() - started).count();
    bench::writeJson(args.outDir, "accumulation.json", report);
    bench::writeCsv(args.outDir, "accumulation.csv", "rep,trainer_samples_per_s,bare_samples_per_s,ratio", rows);
    bench::writeCsv(args.outDir, "microbatch_sweep.csv", "micro_batch,accumulation_steps,samples_per_s,speedup_vs_1",
                    sweepRows);
    std::printf("accumulation: trainer/bare = %.3f (median of paired ratios %.3f); %.1f s\n",
                report["ratio_of_medians"].get<double>(), bench::median(ratios), report["seconds"].get<double>());
    return 0;
}

}  // namespace bench_accumulation

BATCHPILOT_BENCH_MAIN("batchpilot-bench-accumulation", bench_accumulation::run)
