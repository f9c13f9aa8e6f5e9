#include "yardstick/plain_loop.h"

#include <chrono>
#include <exception>
#include <memory>
#include <stdexcept>
#include <vector>

#include <torch/torch.h>

#include "core/device/counting_allocator.h"
#include "core/data/dataset.h"
#include "core/device/device.h"
#include "core/nn/model.h"
#include "core/nn/model_factory.h"

namespace batchpilot::yardstick {
namespace {

using Clock = std::chrono::steady_clock;

bool isOutOfMemory(const std::exception_ptr& error) {
    try {
        std::rethrow_exception(error);
    } catch (const c10::OutOfMemoryError&) {
        return true;
    } catch (const std::bad_alloc&) {
        return true;
    } catch (const std::exception& e) {
        // TorchScript wraps the allocator's error in its own; the text keeps it.
        const std::string text = e.what();
        return text.find("OutOfMemoryError") != std::string::npos ||
               text.find("can't allocate memory") != std::string::npos ||
               text.find("out of memory") != std::string::npos;
    }
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const core::OptimizerOptions& o,
                                                       const std::vector<torch::Tensor>& parameters) {
    switch (o.kind) {
    case core::OptimizerKind::Sgd:
        return std::make_unique<torch::optim::SGD>(
            parameters, torch::optim::SGDOptions(o.learningRate).momentum(o.momentum).weight_decay(o.weightDecay));
    case core::OptimizerKind::Adam:
        return std::make_unique<torch::optim::Adam>(parameters, torch::optim::AdamOptions(o.learningRate)
                                                                    .betas({o.beta1, o.beta2})
                                                                    .eps(o.epsilon)
                                                                    .weight_decay(o.weightDecay));
    case core::OptimizerKind::AdamW:
        return std::make_unique<torch::optim::AdamW>(parameters, torch::optim::AdamWOptions(o.learningRate)
                                                                     .betas({o.beta1, o.beta2})
                                                                     .eps(o.epsilon)
                                                                     .weight_decay(o.weightDecay));
    }
    return nullptr;
}

torch::Tensor lossOf(core::LossKind kind, const torch::Tensor& output, const torch::Tensor& target) {
    if (kind == core::LossKind::Mse) return torch::mse_loss(output, target.to(output.dtype()));
    return torch::nn::functional::cross_entropy(output, target);
}

}  // namespace

PlainLoopRun runPlainLoop(const PlainLoopSetup& setup, int64_t microBatch, int64_t targetBatch, int steps) {
    PlainLoopRun run;
    core::installCountingAllocator();
    const auto device = core::parseDevice(setup.deviceName());
    if (!device) {
        run.error = device.error();
        return run;
    }
    // The samples live in host memory, as a DataLoader's do: only what reaches the device counts.
    auto data = [&] {
        core::CountingScope host(false);
        core::DataOptions options = setup.data;
        options.samples = std::max(options.samples, targetBatch);
        return core::makeDataset(options);
    }();
    if (!data) {
        run.error = data.error();
        return run;
    }
    auto& allocator = core::CountingAllocator::instance();
    const int64_t previousBudget = allocator.budget();
    core::CountingScope counting(true);
    // The device's own meter, as BatchPilot reads it: the counting allocator with the budget on a
    // virtual GPU, the caching allocator's reserved bytes on a CUDA device.
    const std::unique_ptr<core::MemoryMeter> meter = core::openMeter(*device);
    const bool cuda = device->kind == core::DeviceKind::Cuda;
    const torch::Device where =
        cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device->index)) : torch::Device(torch::kCPU);
    const int64_t baseline = meter->reserved();
    meter->resetPeak();
    std::exception_ptr error;
    try {
        torch::manual_seed(1);
        auto made = core::makeModel(setup.model, **data);
        if (!made) throw std::runtime_error(made.error());
        std::shared_ptr<core::Model> model = *made;
        model->to(where);
        model->train(true);
        run.parameterBytes = meter->reserved() - baseline;
        const std::vector<torch::Tensor> parameters = model->parameters();
        auto optimizer = makeOptimizer(setup.optimizer, parameters);
        Clock::time_point timed;
        int64_t next = 0;  // the first sample of the next batch
        for (int step = 0; step < steps; ++step) {
            if (step == 1) timed = Clock::now();
            for (int64_t done = 0; done < targetBatch;) {
                const int64_t size = std::min(microBatch, targetBatch - done);
                std::vector<int64_t> indices(static_cast<size_t>(size));
                for (auto& index : indices) index = next++ % (*data)->size();
                core::Batch host;
                {
                    core::CountingScope hostMemory(false);
                    host = (*data)->get(indices);
                }
                // The copy to the device (on a virtual GPU, a counted copy stands for it).
                const torch::Tensor inputs = cuda ? host.inputs.to(where) : host.inputs.clone();
                const torch::Tensor targets = cuda ? host.targets.to(where) : host.targets.clone();
                host = core::Batch{};
                const torch::Tensor loss = lossOf(setup.loss, model->forward(inputs), targets);
                (loss * (static_cast<double>(size) / static_cast<double>(targetBatch))).backward();
                done += size;
            }
            optimizer->step();
            if (step == steps - 1) run.fixedBytes = meter->allocated() - baseline;
            // PyTorch's zero_grad(set_to_none=True), its default since 2.0.
            for (const auto& p : parameters) p.mutable_grad() = torch::Tensor();
        }
        if (cuda) torch::cuda::synchronize(device->index);
        if (steps > 1) {
            run.seconds = std::chrono::duration<double>(Clock::now() - timed).count();
            run.samplesPerSecond = run.seconds > 0 ? static_cast<double>(targetBatch * (steps - 1)) / run.seconds : 0;
        }
        run.fit = true;
    } catch (const std::exception&) {
        error = std::current_exception();
    }
    run.peakBytes = meter->peakReserved() - baseline;
    if (error) {
        if (!isOutOfMemory(error)) {
            try {
                std::rethrow_exception(error);
            } catch (const std::exception& e) {
                run.error = e.what();
            }
        }
        // LibTorch 2.x keeps the failed backward's tasks in the autograd engine's queue, holding
        // their tensors, until another backward runs: a tiny one on the same device lets them go.
        error = nullptr;
        core::CountingScope uncounted(false);
        auto x = torch::zeros({1}, torch::TensorOptions().device(where).requires_grad(true));
        (x * 2).sum().backward();
    }
    meter->releaseCache();
    allocator.setBudget(previousBudget);
    return run;
}

std::vector<torch::Tensor> replayPlainLoop(const PlainLoopSetup& setup, const std::vector<PlainBatch>& batches,
                                           uint64_t seed) {
    core::installCountingAllocator();
    const auto device = core::parseDevice(setup.deviceName());
    if (!device) throw std::runtime_error(device.error());
    auto data = core::makeDataset(setup.data);
    if (!data) throw std::runtime_error(data.error());
    const torch::Device where = device->kind == core::DeviceKind::Cuda
                                    ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device->index))
                                    : torch::Device(torch::kCPU);
    torch::manual_seed(seed);
    auto made = core::makeModel(setup.model, **data);
    if (!made) throw std::runtime_error(made.error());
    std::shared_ptr<core::Model> model = *made;
    model->to(where);
    model->train(true);
    const std::vector<torch::Tensor> parameters = model->parameters();
    auto optimizer = makeOptimizer(setup.optimizer, parameters);
    for (const PlainBatch& batch : batches) {
        int64_t total = 0;
        for (const auto& micro : batch) total += static_cast<int64_t>(micro.size());
        for (const auto& micro : batch) {
            const core::Batch host = (*data)->get(micro);
            const torch::Tensor loss =
                lossOf(setup.loss, model->forward(host.inputs.to(where)), host.targets.to(where));
            (loss * (static_cast<double>(micro.size()) / static_cast<double>(total))).backward();
        }
        optimizer->step();
        for (const auto& p : parameters) p.mutable_grad() = torch::Tensor();
    }
    std::vector<torch::Tensor> out;
    for (const auto& p : parameters) out.push_back(p.detach().to(torch::kCPU).clone());
    return out;
}

int64_t plainLoopLargest(const PlainLoopSetup& setup, int64_t upper, int confirmAbove) {
    // The first run of a model in a process can need less memory than every later one (seen with
    // TorchScript convolution models on LibTorch 1.13: 106 MiB against 142 MiB at micro-batch 16,
    // the same model, data and loop), so a search whose first size happened to be the largest
    // fitting one would report a size no later run trains with. One run without a budget first:
    // every size is then measured as training goes on.
    PlainLoopSetup warmUp = setup;
    // A virtual GPU's run without its budget, on the host.
    if (warmUp.device.empty() || warmUp.device.starts_with("virtual")) warmUp.device = "cpu";
    (void)runPlainLoop(warmUp, 1, 2, /*steps=*/1);
    const auto fits = [&](int64_t size) {
        const PlainLoopRun run = runPlainLoop(setup, size, 2 * size, /*steps=*/2);
        if (!run.error.empty())
            throw std::runtime_error("the plain loop failed at micro-batch " + std::to_string(size) + ": " + run.error);
        return run.fit;
    };
    int64_t lo = 0;
    int64_t hi = upper + 1;
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    for (int64_t n = lo + 1; n <= std::min(upper, lo + confirmAbove); ++n) {
        if (fits(n)) lo = n;
    }
    return lo;
}

}  // namespace batchpilot::yardstick
