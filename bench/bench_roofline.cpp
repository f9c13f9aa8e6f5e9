// batchpilot-bench-roofline: how far each model's training step is from what this machine can do.
// Measures the machine's peaks through LibTorch (a large float32 GEMM, a convolution layer, and
// memory bandwidth as a large copy), then trains each built-in model and a TorchScript model at a
// fixed micro-batch and counts the step's matrix-multiply and convolution FLOPs (forward and
// backward, from the operators' shapes, via RecordFunction) and the bytes it allocates. Writes
// roofline-<label>.json to --out. Run once per LibTorch build, BLAS and thread count.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "bench/bench_util.h"
#include "core/device/counting_allocator.h"
#include "core/device/math_libraries.h"
#include "core/train/trainer.h"
#include "bench/bench_main.h"

namespace bench_roofline {

namespace {

using namespace batchpilot;
using Clock = std::chrono::steady_clock;

struct Args {
    std::string outDir = ".";
    std::string label = "run";
    std::string torchscript;  ///< a TorchScript model for 3x32x32 inputs and 10 classes
    int threads = 0;
    bool quick = false;
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const bool hasValue = i + 1 < argc;
        if (arg == "--out" && hasValue)
            a.outDir = argv[++i];
        else if (arg == "--label" && hasValue)
            a.label = argv[++i];
        else if (arg == "--torchscript" && hasValue)
            a.torchscript = argv[++i];
        else if (arg == "--threads" && hasValue)
            a.threads = std::atoi(argv[++i]);
        else if (arg == "--quick")
            a.quick = true;
        else {
            std::fprintf(stderr,
                         "usage: batchpilot-bench-roofline [--out DIR] [--label NAME] [--threads N] "
                         "[--torchscript MODEL.pt] [--quick]\n");
            std::exit(arg == "--help" ? 0 : 2);
        }
    }
    return a;
}

/// Median seconds of `repeats` calls of `work` after one warm-up call.
template <typename F>
double medianSeconds(int repeats, F&& work) {
    work();
    std::vector<double> seconds;
    for (int i = 0; i < repeats; ++i) {
        const auto start = Clock::now();
        work();
        seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    return bench::median(seconds);
}

// ---- FLOPs of the operators that do the arithmetic, from their input shapes ----------------

std::atomic<double> g_flops{0};
std::atomic<bool> g_counting{false};

int64_t convOutput(int64_t in, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
    return (in + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
}

/// 2 × multiply-adds of a 2-D convolution given input [N,C,H,W], weight [O,C/g,kh,kw].
double convFlops(const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride, c10::IntArrayRef padding,
                 c10::IntArrayRef dilation) {
    if (input.dim() != 4 || weight.dim() != 4) return 0;
    const int64_t h = convOutput(input.size(2), weight.size(2), stride[0], padding[0], dilation[0]);
    const int64_t w =
        convOutput(input.size(3), weight.size(3), stride.size() > 1 ? stride[1] : stride[0],
                   padding.size() > 1 ? padding[1] : padding[0], dilation.size() > 1 ? dilation[1] : dilation[0]);
    return 2.0 * double(input.size(0)) * double(weight.size(0)) * double(h) * double(w) * double(weight.size(1)) *
           double(weight.size(2)) * double(weight.size(3));
}

std::unique_ptr<at::ObserverContext> onOperator(const at::RecordFunction& fn) {
    if (!g_counting.load()) return nullptr;
    const std::string_view name = fn.name();
    const auto inputs = fn.inputs();
    double flops = 0;
    const auto tensor = [&](size_t i) {
        return i < inputs.size() && inputs[i].isTensor() ? inputs[i].toTensor() : at::Tensor();
    };
    if (name == "aten::mm" || name == "aten::addmm") {
        const auto a = tensor(name == "aten::mm" ? 0 : 1);
        const auto b = tensor(name == "aten::mm" ? 1 : 2);
        if (a.defined() && b.defined() && a.dim() == 2 && b.dim() == 2)
            flops = 2.0 * double(a.size(0)) * double(a.size(1)) * double(b.size(1));
    } else if (name == "aten::bmm") {
        const auto a = tensor(0);
        const auto b = tensor(1);
        if (a.defined() && b.defined() && a.dim() == 3)
            flops = 2.0 * double(a.size(0)) * double(a.size(1)) * double(a.size(2)) * double(b.size(2));
    } else if (name == "aten::convolution" && inputs.size() >= 6) {
        flops = convFlops(tensor(0), tensor(1), inputs[3].toIntList().vec(), inputs[4].toIntList().vec(),
                          inputs[5].toIntList().vec());
    } else if (name == "aten::convolution_backward" && inputs.size() >= 11) {
        // grad_output [N,O,H',W'] stands for the output: each of grad_input and grad_weight costs
        // as much as the forward convolution.
        const auto input = tensor(1);
        const auto weight = tensor(2);
        const double forward = convFlops(input, weight, inputs[4].toIntList().vec(), inputs[5].toIntList().vec(),
                                         inputs[6].toIntList().vec());
        const auto mask = inputs[10].toBoolList().vec();
        flops = forward * ((mask.size() > 0 && mask[0] ? 1 : 0) + (mask.size() > 1 && mask[1] ? 1 : 0));
    }
    if (flops > 0) g_flops.fetch_add(flops);
    return nullptr;
}

// ---- peaks -------------------------------------------------------------------------------------

nlohmann::json peaks(bool quick) {
    torch::NoGradGuard noGrad;
    const int repeats = quick ? 3 : 10;
    nlohmann::json out;
    {
        const int64_t n = 1024;
        const auto a = torch::randn({n, n});
        const auto b = torch::randn({n, n});
        const double s = medianSeconds(repeats, [&] { (void)torch::mm(a, b); });
        out["gemm_flops_per_second"] = 2.0 * double(n) * double(n) * double(n) / s;
        out["gemm"] = "float32 1024x1024 by 1024x1024";
    }
    {
        const auto x = torch::randn({32, 64, 32, 32});
        const auto w = torch::randn({64, 64, 3, 3});
        const double s = medianSeconds(repeats, [&] { (void)torch::conv2d(x, w, {}, 1, 1); });
        out["conv_flops_per_second"] = 2.0 * 32 * 64 * 32 * 32 * 64 * 9 / s;
        out["conv"] = "float32 3x3 convolution, 32x64x32x32 input, 64 filters";
    }
    {
        // Read and write 256 MiB: far beyond the caches.
        const auto src = torch::ones({int64_t{64} << 20});
        auto dst = torch::empty_like(src);
        const double s = medianSeconds(repeats, [&] { dst.copy_(src); });
        out["bandwidth_bytes_per_second"] = 2.0 * double(src.nbytes()) / s;
        out["bandwidth"] = "copy of 256 MiB (bytes read + written)";
    }
    return out;
}

// ---- models --------------------------------------------------------------------------------------

class StepTimes final : public core::EventSink {
public:
    void onEvent(const core::Event& e) override {
        if (const auto* s = std::get_if<core::StepMetrics>(&e)) seconds.push_back(s->stepSeconds);
        if (const auto* err = std::get_if<core::ErrorEvent>(&e)) error = err->message;
    }
    std::vector<double> seconds;
    std::string error;
};

nlohmann::json model(const std::string& name, const std::string& label, int64_t micro, int threads, bool quick) {
    core::TrainerOptions o;
    o.model.name = name;
    o.data.samples = 4096;
    o.device = "cpu";
    o.targetBatch = micro;
    o.probe.initialMicroBatch = o.probe.maxMicroBatch = micro;
    o.probe.objective = core::ProbeObjective::Largest;  // exactly this micro-batch
    o.steps = quick ? 4 : 8;
    o.intraOpThreads = threads;
    o.seed = 1;
    StepTimes times;
    auto& allocator = core::CountingAllocator::instance();
    const int64_t bytesBefore = allocator.countedBytes();
    g_flops.store(0);
    g_counting.store(true);
    core::Trainer trainer(o, times);
    const auto result = trainer.run();
    g_counting.store(false);
    if (result.state != core::RunState::Finished) throw std::runtime_error(label + ": " + result.error);
    const double steps = double(times.seconds.size());
    // Steps 3.. : the first holds the probe trial and the optimizer state's creation.
    std::vector<double> steady(times.seconds.begin() + std::min<size_t>(2, times.seconds.size() - 1),
                               times.seconds.end());
    const double seconds = bench::median(steady);
    const double flops = g_flops.load() / steps;
    const double bytes = double(allocator.countedBytes() - bytesBefore) / steps;
    nlohmann::json out;
    out["model"] = label;
    out["micro_batch"] = micro;
    out["seconds_per_step"] = seconds;
    out["samples_per_second"] = double(micro) / seconds;
    out["flops_per_step"] = flops;
    out["flops_per_second"] = flops / seconds;
    out["allocated_bytes_per_step"] = bytes;
    out["allocated_bytes_per_second"] = bytes / seconds;
    return out;
}

}  // namespace

int run(int argc, char** argv) {
    const Args args = parse(argc, argv);
    core::installCountingAllocator();
    if (args.threads > 0) torch::set_num_threads(args.threads);
    at::addGlobalCallback(
        at::RecordFunctionCallback(&onOperator).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
    const core::MathLibraries math = core::mathLibraries(torch::get_num_threads());

    nlohmann::json out;
    out["label"] = args.label;
    out["libraries"] = core::describe(math);
    out["blas"] = math.blas;
    out["torch"] = math.torchVersion;
    out["threads"] = torch::get_num_threads();
    out["peaks"] = peaks(args.quick);
    std::fprintf(stderr, "%s: GEMM %.1f GFLOP/s, conv %.1f GFLOP/s, copy %.1f GB/s\n", args.label.c_str(),
                 out["peaks"]["gemm_flops_per_second"].get<double>() / 1e9,
                 out["peaks"]["conv_flops_per_second"].get<double>() / 1e9,
                 out["peaks"]["bandwidth_bytes_per_second"].get<double>() / 1e9);
    std::vector<std::pair<std::string, std::string>> models{{"mlp", "mlp"}, {"cnn", "cnn"}, {"resnet", "resnet"}};
    if (!args.torchscript.empty()) models.emplace_back(args.torchscript, "TorchScript SmallNet");
    for (const auto& [name, label] : models) {
        auto row = model(name, label, 512, torch::get_num_threads(), args.quick);
        std::fprintf(stderr, "  %-22s %8.0f samples/s  %6.2f GFLOP/s  %6.2f GB/s allocated\n", label.c_str(),
                     row["samples_per_second"].get<double>(), row["flops_per_second"].get<double>() / 1e9,
                     row["allocated_bytes_per_second"].get<double>() / 1e9);
        out["models"].push_back(row);
    }
    bench::writeJson(args.outDir, "roofline-" + args.label + ".json", out);
    return 0;
}

}  // namespace bench_roofline

BATCHPILOT_BENCH_MAIN("batchpilot-bench-roofline", bench_roofline::run)
