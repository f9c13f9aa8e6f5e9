#include "core/nn/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include "core/device/torch_compat.h"

namespace batchpilot::core {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// What backward needs besides the saved input: the segment, its buffers, and the CPU random
/// generator's state when forward ran. Kept in the autograd context as a capsule.
struct SegmentRecord : torch::CustomClassHolder {
    Segment segment;
    std::vector<torch::Tensor> parameters;  ///< the tensors forward was given, in order
    std::vector<torch::Tensor> buffers;
    torch::Tensor generatorState;
    AutocastState cpuAutocast;  ///< the recomputation casts as forward did (bfloat16 or not)
    AutocastState cudaAutocast;
};

/// The autograd function: forward without a graph, backward by recomputation. Its inputs are the
/// segment's input and parameters (so that autograd routes their gradients through it) and the
/// record (not a tensor: no gradient).
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
    static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, at::TensorList /*parameters*/,
                                 const c10::intrusive_ptr<SegmentRecord>& record) {
        ctx->save_for_backward({input});
        ctx->saved_data["record"] = c10::IValue::make_capsule(record);
        // Function::apply already runs forward without recording a graph.
        return record->segment(input);
    }

    static variable_list backward(AutogradContext* ctx, variable_list gradOutputs) {
        const torch::Tensor saved = ctx->get_saved_variables().front();
        const auto capsule = ctx->saved_data["record"].toCapsule();
        auto& record = static_cast<SegmentRecord&>(*capsule);
        const std::vector<torch::Tensor>& parameters = record.parameters;
        const size_t count = parameters.size();

        // The recomputation must not update the running statistics a second time, nor move the
        // random generator on from where training left it. The statistics are put back once the
        // recomputed graph has been back-propagated (BatchNorm's backward checks that they were
        // not changed in between), also when that fails.
        struct PutBack {
            std::vector<torch::Tensor> buffers;
            std::vector<torch::Tensor> values;
            ~PutBack() {
                torch::NoGradGuard noGrad;
                // values may be shorter: a clone below ran out of memory
                for (size_t i = 0; i < values.size(); ++i) {
                    try {
                        buffers[i].copy_(values[i]);
                    } catch (const std::exception&) {  // same shape and device: not expected to fail
                    }
                }
            }
        } putBack{record.buffers, {}};
        {
            torch::NoGradGuard noGrad;
            for (const torch::Tensor& b : record.buffers) putBack.values.push_back(b.clone());
        }
        const torch::Tensor generatorNow = cpuGeneratorState();
        setCpuGeneratorState(record.generatorState);
        torch::Tensor output;
        torch::Tensor input = saved.detach().requires_grad_(saved.requires_grad());
        try {
            torch::AutoGradMode enable(true);
            AutocastScope cpu(c10::DeviceType::CPU, record.cpuAutocast);
            AutocastScope cuda(c10::DeviceType::CUDA, record.cudaAutocast);
            output = record.segment(input);
        } catch (...) {
            setCpuGeneratorState(generatorNow);
            throw;
        }
        setCpuGeneratorState(generatorNow);

        // Gradients for the input and the parameters that want one; the others stay undefined.
        variable_list inputs;
        std::vector<size_t> where;  // position of each of `inputs` among forward's inputs
        if (input.requires_grad()) {
            inputs.push_back(input);
            where.push_back(0);
        }
        for (size_t i = 0; i < count; ++i) {
            if (parameters[i].requires_grad()) {
                inputs.push_back(parameters[i]);
                where.push_back(1 + i);
            }
        }
        variable_list gradients(1 + count + 1);  // input, parameters, the record
        if (inputs.empty() || !output.requires_grad()) return gradients;
        const variable_list found = torch::autograd::grad({output}, inputs, {gradOutputs.front()},
                                                          /*retain_graph=*/false, /*create_graph=*/false,
                                                          /*allow_unused=*/true);
        for (size_t i = 0; i < found.size(); ++i) gradients[where[i]] = found[i];
        return gradients;
    }
};

}  // namespace

torch::Tensor cpuGeneratorState() {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
}

void setCpuGeneratorState(const torch::Tensor& state) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
}

torch::Tensor checkpointed(const Segment& segment, const torch::Tensor& input,
                           const std::vector<torch::Tensor>& parameters, const std::vector<torch::Tensor>& buffers) {
    bool needsGradient = input.requires_grad();
    for (const torch::Tensor& p : parameters) needsGradient = needsGradient || p.requires_grad();
    if (!torch::GradMode::is_enabled() || !needsGradient) return segment(input);
    auto record = c10::make_intrusive<SegmentRecord>();
    record->segment = segment;
    record->buffers = buffers;
    record->parameters = parameters;
    record->generatorState = cpuGeneratorState();
    record->cpuAutocast = AutocastState::current(c10::DeviceType::CPU);
    record->cudaAutocast = AutocastState::current(c10::DeviceType::CUDA);
    return CheckpointFunction::apply(input, at::TensorList(parameters), record);
}

}  // namespace batchpilot::core
