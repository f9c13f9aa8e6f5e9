#include "core/nn/torchscript_model.h"

#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/versions.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/version.h>

#include "core/nn/activation_checkpoint.h"
#include "core/device/counting_allocator.h"
#include "core/data/dataset.h"
#include "core/nn/loss.h"
#include "core/device/oom.h"

namespace batchpilot::core {
namespace {

namespace fs = std::filesystem;

/// What went wrong, in one line: for an interpreter error, the original error at the end of its
/// traceback.
std::string reason() {
    return classifyFailure(std::current_exception()).message;
}

/// When a model file does not load: which file-format version wrote it, against the newest this
/// LibTorch reads, so that a file from a newer PyTorch says so (empty when the file is no archive).
std::string formatVersionNote(const std::string& path) {
    try {
        caffe2::serialize::PyTorchStreamReader reader(path);
        const uint64_t written = reader.version();
        const uint64_t readable = caffe2::serialize::kMaxSupportedFileFormatVersion;
        if (written <= readable) return {};
        return "; the file has TorchScript format version " + std::to_string(written) + ", but LibTorch " +
               TORCH_VERSION + " reads up to version " + std::to_string(readable) +
               ": it was written by a newer PyTorch than this build's LibTorch — export it with PyTorch " +
               std::string(TORCH_VERSION).substr(0, std::string(TORCH_VERSION).rfind('.')) +
               " (e.g. Debian's python3-torch), or build BatchPilot against the current LibTorch (scripts/demo --torch "
               "pip)";
    } catch (const std::exception&) {
        return {};
    }
}

/// Out-of-memory is the trainer's to classify and report; everything else is the model's fault.
void rethrowIfOutOfMemory() {
    if (classifyFailure(std::current_exception()).outOfMemory) throw;
}

/// LibTorch sizes each storage of a TorchScript file by the element count its pickle claims, but
/// reads only the bytes its zip record holds, so a file that claims more would be read past the
/// end in forward. The records are read into CountingAllocator blocks of their real size:
/// compare. Returns the first tensor that claims more than it holds, described, or empty.
class StorageClaimCheck {
public:
    std::string firstViolation(const torch::jit::Module& module) {
        for (const auto& attribute : module.named_attributes(/*recurse=*/true)) {
            visit(attribute.name, attribute.value, 0);
            if (!m_found.empty()) return m_found;
        }
        for (const auto& method : module.get_methods()) visitBlock(method.graph()->block(), method.name());
        for (const auto& sub : module.modules()) {
            for (const auto& method : sub.get_methods()) visitBlock(method.graph()->block(), method.name());
        }
        return m_found;
    }

private:
    void check(const std::string& where, const at::Tensor& tensor) {
        if (!m_found.empty() || !tensor.defined() || !tensor.unsafeGetTensorImpl()->has_storage()) return;
        const auto& storage = tensor.storage();
        const int64_t held = CountingAllocator::blockBytes(storage.data_ptr());
        const auto claimed = static_cast<int64_t>(storage.nbytes());
        if (held >= 0 && claimed > held) {
            m_found = "tensor " + where + " claims " + std::to_string(claimed) + " bytes of data, but the file holds " +
                      std::to_string(held) + " for it";
        }
    }
    void visit(const std::string& where, const c10::IValue& value, int depth) {
        if (!m_found.empty() || depth > 64) return;
        if (value.isTensor()) {
            check(where, value.toTensor());
        } else if (value.isList()) {
            const auto list = value.toListRef();
            for (size_t i = 0; i < list.size(); ++i) visit(where + "[" + std::to_string(i) + "]", list[i], depth + 1);
        } else if (value.isTuple()) {
            const auto& elements = value.toTupleRef().elements();
            for (size_t i = 0; i < elements.size(); ++i)
                visit(where + "[" + std::to_string(i) + "]", elements[i], depth + 1);
        } else if (value.isGenericDict()) {
            for (const auto& entry : value.toGenericDict()) visit(where + "[...]", entry.value(), depth + 1);
        } else if (value.isObject()) {
            const auto object = value.toObject();
            for (size_t i = 0; i < object->slots().size(); ++i)
                visit(where + "." + std::to_string(i), object->getSlot(i), depth + 1);
        }
    }
    void visitBlock(const torch::jit::Block* block, const std::string& method) {
        for (const torch::jit::Node* node : block->nodes()) {
            if (!m_found.empty()) return;
            if (node->kind() == c10::prim::Constant && node->outputs().size() == 1 &&
                node->output()->type()->kind() == c10::TypeKind::TensorType) {
                if (const auto constant = torch::jit::toIValue(node->output()))
                    visit("constant in " + method, *constant, 0);
            }
            for (const torch::jit::Block* inner : node->blocks()) visitBlock(inner, method);
        }
    }
    std::string m_found;
};

}  // namespace

namespace {

/// The top-level children that `module`'s forward calls one after another, each on the previous
/// one's output, the first on forward's input, and whose last output forward returns; empty,
/// with `problem` saying what else forward does, when it is not such a chain.
std::vector<std::string> childChain(torch::jit::Module& module, std::string& problem) {
    const auto method = module.find_method("forward");
    if (!method) {
        problem = "it has no forward method";
        return {};
    }
    const std::shared_ptr<torch::jit::Graph> graph = method->graph();
    if (graph->inputs().size() != 2 || graph->outputs().size() != 1) {
        problem = "its forward does not take one input and return one output";
        return {};
    }
    torch::jit::Value* self = graph->inputs()[0];
    torch::jit::Value* current = graph->inputs()[1];
    std::map<const torch::jit::Value*, std::string> children;
    std::vector<std::string> chain;
    for (torch::jit::Node* node : graph->nodes()) {
        const c10::Symbol kind = node->kind();
        if (kind == c10::prim::GetAttr && node->input(0) == self && node->output()->type()->cast<c10::ClassType>() &&
            node->output()->type()->cast<c10::ClassType>()->is_module()) {
            children[node->output()] = node->s(c10::attr::name);
            continue;
        }
        if (kind == c10::prim::Constant) continue;  // an op that uses it is what stops the chain
        const bool callsChild = kind == c10::prim::CallMethod && node->s(c10::attr::name) == "forward" &&
                                node->inputs().size() == 2 && children.count(node->input(0)) > 0;
        if (callsChild && node->input(1) == current && current->uses().size() == 1) {
            chain.push_back(children[node->input(0)]);
            current = node->output();
            continue;
        }
        std::string found = callsChild                      ? "calls a child on another value"
                            : kind == c10::prim::CallMethod ? "calls the method " + node->s(c10::attr::name)
                                                            : std::string("runs ") + kind.toQualString();
        problem =
            "its forward does more than call its top-level children one after another, each on the previous "
            "one's output (it " +
            found + ")";
        return {};
    }
    if (graph->outputs()[0] != current || chain.empty()) {
        problem = chain.empty() ? "its forward calls no child" : "its forward does not return the last child's output";
        return {};
    }
    if (chain.size() == 1) {
        // A wrapper around one child (forward returns self.net(x)): that child's chain, if it has one.
        torch::jit::Module child = module.attr(chain.front()).toModule();
        std::vector<std::string> inner = childChain(child, problem);
        if (inner.empty()) {
            problem = "its forward calls one child, " + chain.front() + ", and " + problem;
            return {};
        }
        for (std::string& path : inner) path = chain.front() + "." + path;
        return inner;
    }
    return chain;
}

}  // namespace

TorchScriptModel::TorchScriptModel(std::string path, torch::jit::Module module)
    : m_path(std::move(path)), m_module(std::move(module)) {
    m_chain = childChain(m_module, m_chainProblem);
}

std::string TorchScriptModel::name() const {
    return "TorchScript " + fs::path(m_path).filename().string();
}

torch::Tensor TorchScriptModel::forward(const torch::Tensor& input) {
    // The graph executor's optimisation (profiling runs, then a graph specialised to the shapes
    // seen) makes a model's memory differ from one call and one shape to the next: the probe's
    // trials, the memory model and fault recovery rely on the same micro-batch needing the same
    // memory every time. Unoptimised execution is the same interpreter without that (thread-local).
    torch::jit::GraphOptimizerEnabledGuard unoptimised(false);
    if (m_checkpointing && torch::GradMode::is_enabled()) {
        // Each child of the chain is a part that checkpointing recomputes in backward (where the
        // guard above is not in effect on the autograd engine's threads: each part sets it).
        torch::Tensor h = input;
        for (const std::string& name : m_chain) {
            torch::jit::Module child = m_module;
            for (size_t from = 0; from <= name.size();) {  // a dotted path: net.0
                const size_t dot = std::min(name.find('.', from), name.size());
                child = child.attr(name.substr(from, dot - from)).toModule();
                from = dot + 1;
            }
            std::vector<torch::Tensor> parameters;
            std::vector<torch::Tensor> buffers;
            for (const auto& p : child.parameters(/*recurse=*/true))
                if (p.requires_grad()) parameters.push_back(p);
            for (const auto& b : child.buffers(/*recurse=*/true)) buffers.push_back(b);
            const std::string path = m_path;
            h = checkpointed(
                [child, name, path](const torch::Tensor& x) mutable {
                    torch::jit::GraphOptimizerEnabledGuard unoptimisedPart(false);
                    torch::jit::IValue out = child.forward({x});
                    if (!out.isTensor()) {
                        throw std::runtime_error("the TorchScript model " + path + "'s child " + name + " returned a " +
                                                 out.tagKind() + " instead of a Tensor");
                    }
                    return out.toTensor();
                },
                h, parameters, buffers);
        }
        return h;
    }
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

std::vector<std::string> TorchScriptModel::bufferNames() const {
    std::vector<std::string> names;
    for (const auto& item : m_module.named_buffers(/*recurse=*/true)) names.push_back(item.name);
    return names;
}

void TorchScriptModel::to(const torch::Device& device) {
    m_module.to(device);
}
void TorchScriptModel::train(bool on) {
    m_module.train(on);
}

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
    installCountingAllocator();  // the storage check below reads the sizes of its blocks
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

    if (const std::string claim = StorageClaimCheck().firstViolation(module); !claim.empty()) {
        return tl::unexpected(file + " is damaged or was altered: its " + claim +
                              ", so running it would read past its data; export the model again (model files run "
                              "code: load them only from a source you trust)");
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
        return tl::unexpected(file +
                              " has no trainable parameters: nothing to train (were its weights exported as "
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
            return tl::unexpected(file + " returns " + shapeText(out.narrow(0, 0, 1)) +
                                  " for one sample, but the data's target is " + shapeText(target.narrow(0, 0, 1)) +
                                  ": make it output one value per target");
        }
    } else if (out.dim() != 2 || out.size(1) != data.classes()) {
        return tl::unexpected(file + " returns " + shapeText(out.narrow(0, 0, 1)) + " for one sample; the data has " +
                              std::to_string(data.classes()) + " classes, so [1, " + std::to_string(data.classes()) +
                              "] is expected: give the model's last layer " + std::to_string(data.classes()) +
                              " outputs");
    }
    return std::shared_ptr<Model>(model);
}

}  // namespace batchpilot::core
