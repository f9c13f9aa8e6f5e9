#include "core/torchscript_model.h"

#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/versions.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/version.h>

#include "core/dataset.h"
#include "core/loss.h"
#include "core/oom.h"

namespace batchpilot::core {
namespace {

namespace fs = std::filesystem;

/// What went wrong, in one line: for an interpreter error, the original error at the end of its
/// traceback.
std::string reason() { return classifyFailure(std::current_exception()).message; }

/// When a model file does not load: which file-format version wrote it, against the newest this
/// LibTorch reads, so that a file from a newer PyTorch says so (empty when the file is no archive).
std::string formatVersionNote(const std::string& path) {
    try {
        caffe2::serialize::PyTorchStreamReader reader(path);
        const uint64_t written = reader.version();
        const uint64_t readable = caffe2::serialize::kMaxSupportedFileFormatVersion;
        if (written <= readable) return {};
        return "; the file has TorchScript format version " + std::to_string(written) + ", but LibTorch " + TORCH_VERSION +
               " reads up to version " + std::to_string(readable) +
               ": it was written by a newer PyTorch than this build's LibTorch — export it with PyTorch " +
               std::string(TORCH_VERSION).substr(0, std::string(TORCH_VERSION).rfind('.')) +
               " (e.g. Debian's python3-torch), or build BatchPilot against the current LibTorch (scripts/demo --torch pip)";
    } catch (const std::exception&) {
        return {};
    }
}

/// Out-of-memory is the trainer's to classify and report; everything else is the model's fault.
void rethrowIfOutOfMemory() {
    if (classifyFailure(std::current_exception()).outOfMemory) throw;
}

}  // namespace

TorchScriptModel::TorchScriptModel(std::string path, torch::jit::Module module)
    : m_path(std::move(path)), m_module(std::move(module)) {}

std::string TorchScriptModel::name() const { return "TorchScript " + fs::path(m_path).filename().string(); }

torch::Tensor TorchScriptModel::forward(const torch::Tensor& input) {
    // The graph executor's optimisation (profiling runs, then a graph specialised to the shapes
    // seen) makes a model's memory differ from one call and one shape to the next: the probe's
    // trials, the memory model and fault recovery rely on the same micro-batch needing the same
    // memory every time. Unoptimised execution is the same interpreter without that (thread-local).
    torch::jit::GraphOptimizerEnabledGuard unoptimised(false);
    torch::jit::IValue output = m_module.forward({input});
    if (!output.isTensor()) {
        throw std::runtime_error("the TorchScript model " + m_path + " returned a " + output.tagKind() +
                                 " instead of a Tensor");
    }
    return output.toTensor();
}

std::vector<torch::Tensor> TorchScriptModel::parameters() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : m_module.parameters(/*recurse=*/true)) {
        if (p.requires_grad()) out.push_back(p);
    }
    return out;
}

std::vector<std::string> TorchScriptModel::parameterNames() const {
    std::vector<std::string> names;
    for (const auto& item : m_module.named_parameters(/*recurse=*/true)) {
        if (item.value.requires_grad()) names.push_back(item.name);
    }
    return names;
}

std::vector<torch::Tensor> TorchScriptModel::buffers() const {
    std::vector<torch::Tensor> out;
    for (const auto& b : m_module.buffers(/*recurse=*/true)) out.push_back(b);
    return out;
}

void TorchScriptModel::to(const torch::Device& device) { m_module.to(device); }
void TorchScriptModel::train(bool on) { m_module.train(on); }

bool TorchScriptModel::usesBatchStatistics() const {
    for (const auto& sub : m_module.modules()) {
        const auto typeName = sub.type()->name();
        if (typeName && typeName->name().find("BatchNorm") != std::string::npos) return true;
    }
    return false;
}

tl::expected<std::shared_ptr<Model>, std::string> loadTorchScriptModel(const std::string& path, const Dataset& data) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return tl::unexpected("model file " + path + " does not exist");
    if (!fs::is_regular_file(path, ec)) return tl::unexpected("model file " + path + " is not a regular file");
    const std::string file = "model file " + path;

    torch::jit::Module module;
    try {
        module = torch::jit::load(path, torch::Device(torch::kCPU));
    } catch (const std::exception&) {
        rethrowIfOutOfMemory();
        const std::string why = reason();
        if (const std::string version = formatVersionNote(path); !version.empty()) {
            return tl::unexpected(file + " could not be loaded (" + why + ")" + version);
        }
        return tl::unexpected(file + " is not a TorchScript file (" + why +
                              "); export the model from Python with torch.jit.script(model).save(\"model.pt\") — "
                              "a state_dict saved with torch.save cannot be loaded");
    }

    const auto method = module.find_method("forward");
    if (!method) return tl::unexpected(file + " has no forward method; export an nn.Module with torch.jit.script");
    const auto& arguments = method->function().getSchema().arguments();
    // arguments[0] is self.
    std::vector<std::string> required;
    for (size_t i = 1; i < arguments.size(); ++i) {
        if (!arguments[i].default_value()) required.push_back(arguments[i].name());
    }
    if (arguments.size() < 2 || required.size() > 1) {
        std::string listed;
        for (size_t i = 1; i < arguments.size(); ++i) listed += (i > 1 ? ", " : "") + arguments[i].name();
        return tl::unexpected(file + ": forward(" + listed + ") takes " + std::to_string(required.size()) +
                              " required arguments, but training passes exactly one input tensor; "
                              "give the other arguments defaults or wrap the model in one whose forward(x) calls it");
    }
    if (!c10::TensorType::get()->isSubtypeOf(*arguments[1].type())) {
        return tl::unexpected(file + ": forward's argument " + arguments[1].name() + " is a " +
                              arguments[1].type()->str() + ", but training passes one Tensor");
    }

    int64_t total = 0;
    for (const auto& p : module.parameters(/*recurse=*/true)) {
        (void)p;
        ++total;
    }
    auto model = std::make_shared<TorchScriptModel>(path, module);
    if (total == 0) {
        return tl::unexpected(file + " has no trainable parameters: nothing to train (were its weights exported as "
                              "constants or buffers?)");
    }
    if (model->parameters().empty()) {
        return tl::unexpected(file + " has no trainable parameters: all " + std::to_string(total) +
                              " are frozen (requires_grad=False); unfreeze the layers to train before exporting");
    }

    // One real forward on a sample from the data, in eval mode so that BatchNorm accepts a
    // single sample, shows a shape or type mismatch now, with the file's name on it.
    const bool twoSamples = data.size() >= 2;
    const Batch sample = data.get(twoSamples ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0});
    const int64_t n = sample.inputs.size(0);
    const std::string input = "input " + shapeText(sample.inputs.narrow(0, 0, 1));
    torch::jit::IValue output;
    try {
        torch::NoGradGuard noGrad;
        torch::jit::GraphOptimizerEnabledGuard unoptimised(false);
        module.eval();
        output = module.forward({sample.inputs});
        module.train(true);
    } catch (const std::exception&) {
        rethrowIfOutOfMemory();
        return tl::unexpected(file + " fails on a sample of " + data.name() + " (" + input + "): " + reason() +
                              "; the model must accept inputs of the data's shape");
    }
    if (!output.isTensor()) {
        return tl::unexpected(file + ": forward returns a " + std::string(output.tagKind()) +
                              ", but training needs one Tensor (e.g. logits [N, classes])");
    }
    const torch::Tensor out = output.toTensor();
    if (!out.is_floating_point()) {
        return tl::unexpected(file + ": forward returns a tensor of " + std::string(c10::toString(out.scalar_type())) +
                              ", but the loss needs floating-point outputs");
    }
    if (out.dim() == 0 || out.size(0) != n) {
        return tl::unexpected(file + " returns " + shapeText(out) + " for a batch of " + std::to_string(n) +
                              " samples: the first dimension of the output must be the batch");
    }
    if (sample.targets.is_floating_point()) {
        const torch::Tensor& target = sample.targets;
        if (out.numel() != target.numel()) {
            return tl::unexpected(file + " returns " + shapeText(out.narrow(0, 0, 1)) + " for one sample, but the data's target is " +
                                  shapeText(target.narrow(0, 0, 1)) + ": make it output one value per target");
        }
    } else if (out.dim() != 2 || out.size(1) != data.classes()) {
        return tl::unexpected(file + " returns " + shapeText(out.narrow(0, 0, 1)) + " for one sample; the data has " +
                              std::to_string(data.classes()) + " classes, so [1, " + std::to_string(data.classes()) +
                              "] is expected: give the model's last layer " + std::to_string(data.classes()) + " outputs");
    }
    return std::shared_ptr<Model>(model);
}

}  // namespace batchpilot::core
