#include "core/nn/model.h"

#include "core/nn/activation_checkpoint.h"
#include "core/device/torch_compat.h"

#include <sstream>

namespace batchpilot::core {
namespace nn = torch::nn;

int64_t Model::parameterCount() const {
    int64_t count = 0;
    for (const auto& p : parameters()) count += p.numel();
    return count;
}

int64_t Model::parameterBytes() const {
    int64_t bytes = 0;
    for (const auto& p : parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
    return bytes;
}

std::vector<std::string> Model::parameterNames() const {
    std::vector<std::string> names;
    const size_t count = parameters().size();
    for (size_t i = 0; i < count; ++i) names.push_back("parameter " + std::to_string(i));
    return names;
}

std::vector<std::string> Model::bufferNames() const {
    std::vector<std::string> names;
    const size_t count = buffers().size();
    for (size_t i = 0; i < count; ++i) names.push_back("buffer " + std::to_string(i));
    return names;
}

ModuleModel::ModuleModel(std::string name, std::shared_ptr<nn::Module> module, Forward forward,
                         std::function<void(bool)> checkpointing)
    : m_name(std::move(name)),
      m_module(std::move(module)),
      m_forward(std::move(forward)),
      m_checkpointing(std::move(checkpointing)) {}

std::string ModuleModel::checkpointingUnsupported() const {
    return m_checkpointing ? std::string() : Model::checkpointingUnsupported();
}
void ModuleModel::setCheckpointing(bool on) {
    if (m_checkpointing) m_checkpointing(on);
}

std::vector<torch::Tensor> ModuleModel::parameters() const {
    return m_module->parameters();
}
std::vector<std::string> ModuleModel::parameterNames() const {
    std::vector<std::string> names;
    for (const auto& item : m_module->named_parameters(/*recurse=*/true)) names.push_back(item.key());
    return names;
}
std::vector<torch::Tensor> ModuleModel::buffers() const {
    return m_module->buffers();
}
std::vector<std::string> ModuleModel::bufferNames() const {
    std::vector<std::string> names;
    for (const auto& item : m_module->named_buffers(/*recurse=*/true)) names.push_back(item.key());
    return names;
}
void ModuleModel::to(const torch::Device& device) {
    m_module->to(device);
}
void ModuleModel::train(bool on) {
    m_module->train(on);
}

bool ModuleModel::usesBatchStatistics() const {
    for (const auto& child : m_module->modules(/*include_self=*/true)) {
        if (child->as<nn::BatchNorm2d>() != nullptr || child->as<nn::BatchNorm1d>() != nullptr) {
            return true;
        }
    }
    return false;
}

namespace {

/// A built-in model's switch for activation checkpointing, and its parts run through it.
struct Checkpointable {
    bool checkpointing = false;

    /// `part(x)`; with checkpointing on, without keeping its activations (recomputed in
    /// backward). `modules`: every module the part uses (their parameters and buffers).
    torch::Tensor run(std::initializer_list<const nn::Module*> modules, const torch::Tensor& x,
                      const Segment& part) const {
        if (!checkpointing) return part(x);
        std::vector<torch::Tensor> parameters;
        std::vector<torch::Tensor> buffers;
        for (const nn::Module* m : modules) {
            for (const auto& p : m->parameters()) parameters.push_back(p);
            for (const auto& b : m->buffers()) buffers.push_back(b);
        }
        return checkpointed(part, x, parameters, buffers);
    }
};

struct MlpImpl : nn::Module, Checkpointable {
    MlpImpl(int64_t inputs, int64_t hidden, int64_t classes)
        : fc1(register_module("fc1", nn::Linear(inputs, hidden))),
          fc2(register_module("fc2", nn::Linear(hidden, hidden))),
          out(register_module("out", nn::Linear(hidden, classes))) {}
    torch::Tensor forward(const torch::Tensor& x) {
        auto h = run({fc1.get()}, x.flatten(/*start_dim=*/1),
                     [this](const torch::Tensor& in) { return torch::relu(fc1->forward(in)); });
        h = run({fc2.get()}, h, [this](const torch::Tensor& in) { return torch::relu(fc2->forward(in)); });
        return out->forward(h);
    }
    nn::Linear fc1, fc2, out;
};

struct SmallCnnImpl : nn::Module, Checkpointable {
    SmallCnnImpl(int64_t channels, int64_t width, int64_t classes)
        : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(channels, width / 2, 3).padding(1)))),
          conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(width / 2, width, 3).padding(1)))),
          conv3(register_module("conv3", nn::Conv2d(nn::Conv2dOptions(width, 2 * width, 3).padding(1)))),
          out(register_module("out", nn::Linear(2 * width, classes))) {}
    torch::Tensor forward(const torch::Tensor& x) {
        auto h = run({conv1.get()}, x, [this](const torch::Tensor& in) {
            return torch::max_pool2d(torch::relu(conv1->forward(in)), /*kernel_size=*/2);
        });
        h = run({conv2.get()}, h, [this](const torch::Tensor& in) {
            return torch::max_pool2d(torch::relu(conv2->forward(in)), /*kernel_size=*/2);
        });
        h = run({conv3.get()}, h, [this](const torch::Tensor& in) {
            return torch::adaptive_avg_pool2d(torch::relu(conv3->forward(in)), {1, 1}).flatten(/*start_dim=*/1);
        });
        return out->forward(h);
    }
    nn::Conv2d conv1, conv2, conv3;
    nn::Linear out;
};

/// GroupNorm (exact under accumulation) or BatchNorm (micro-batch statistics).
nn::AnyModule makeNorm(NormKind kind, int64_t channels) {
    if (kind == NormKind::Batch) {
        return nn::AnyModule(nn::BatchNorm2d(channels));
    }
    return nn::AnyModule(nn::GroupNorm(nn::GroupNormOptions(std::min<int64_t>(8, channels), channels)));
}

/// `norm(x)`, a normalisation. Under bfloat16 autocast (memory savers) LibTorch 2.1 and later
/// normalise bfloat16 input with the float32 weights directly; 1.13's CPU kernels reject that mix,
/// so there the layer computes in float32 (as CUDA's autocast runs normalisations), which holds a
/// float32 copy of its input, and its output goes back to bfloat16 for the layers after it.
template <typename Norm>
torch::Tensor normalisedBy(const Norm& norm, const torch::Tensor& x) {
    if (BATCHPILOT_NORMS_TAKE_MIXED_TYPES || x.scalar_type() == torch::kFloat) return norm(x);
    return norm(x.to(torch::kFloat)).to(x.scalar_type());
}

/// The normalisation layer `norm` on `x` (normalisedBy).
torch::Tensor normalised(nn::AnyModule& norm, const torch::Tensor& x) {
    return normalisedBy([&norm](const torch::Tensor& in) { return norm.forward(in); }, x);
}

struct ResidualBlockImpl : nn::Module {
    ResidualBlockImpl(int64_t in, int64_t out, int64_t stride, NormKind norm)
        : conv1(register_module("conv1",
                                nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
          conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
          norm1(makeNorm(norm, out)),
          norm2(makeNorm(norm, out)) {
        register_module("norm1", norm1.ptr());
        register_module("norm2", norm2.ptr());
        if (stride != 1 || in != out) {
            shortcut =
                register_module("shortcut", nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
            shortcutNorm = makeNorm(norm, out);
            register_module("shortcut_norm", shortcutNorm.ptr());
        }
    }
    torch::Tensor forward(const torch::Tensor& x) {
        auto h = torch::relu(normalised(norm1, conv1->forward(x)));
        h = normalised(norm2, conv2->forward(h));
        auto skip = shortcut ? normalised(shortcutNorm, shortcut->forward(x)) : x;
        return torch::relu(h + skip);
    }
    nn::Conv2d conv1, conv2;
    nn::AnyModule norm1, norm2;
    nn::Conv2d shortcut = nullptr;
    nn::AnyModule shortcutNorm;
};
TORCH_MODULE(ResidualBlock);

struct ResNetImpl : nn::Module, Checkpointable {
    ResNetImpl(int64_t channels, int64_t width, int64_t classes, NormKind norm)
        : stem(register_module("stem", nn::Conv2d(nn::Conv2dOptions(channels, width, 3).padding(1).bias(false)))),
          stemNorm(makeNorm(norm, width)),
          blocks(register_module(
              "blocks", nn::Sequential(ResidualBlock(width, width, 1, norm), ResidualBlock(width, 2 * width, 2, norm),
                                       ResidualBlock(2 * width, 4 * width, 2, norm),
                                       ResidualBlock(4 * width, 4 * width, 1, norm)))),
          out(register_module("out", nn::Linear(4 * width, classes))) {
        register_module("stem_norm", stemNorm.ptr());
    }
    torch::Tensor forward(const torch::Tensor& x) {
        // Large inputs (224×224) are reduced early, as ImageNet ResNets do.
        const bool pooled = x.size(2) > 64;
        torch::Tensor h = checkpointing && pooled
                              ? stemInSlices(x)
                              : run({stem.get(), stemNorm.ptr().get()}, x, [this, pooled](const torch::Tensor& in) {
                                    auto s = torch::relu(normalised(stemNorm, stem->forward(in)));
                                    return pooled ? torch::max_pool2d(s, /*kernel_size=*/4) : s;
                                });
        for (size_t i = 0; i < blocks->size(); ++i) {
            auto* block = blocks->ptr(i)->as<ResidualBlockImpl>();
            h = run({block}, h, [block](const torch::Tensor& in) { return block->forward(in); });
        }
        h = torch::adaptive_avg_pool2d(h, {1, 1}).flatten(/*start_dim=*/1);
        return out->forward(h);
    }
    /// The stem of a large input, checkpointed in slices of its output channels. At full
    /// resolution it holds the largest activations of the model — at 1024×1024 one channel is
    /// 4 MiB a sample — and one checkpointed segment would recompute all of them at once in
    /// backward. Convolution, ReLU and pooling act on each output channel on its own, BatchNorm
    /// too and GroupNorm on each group, so slices of whole groups compute what the whole stem
    /// does, and backward recomputes one slice at a time.
    torch::Tensor stemInSlices(const torch::Tensor& x) {
        const int64_t channels = stem->options.out_channels();
        auto* group = stemNorm.ptr()->as<nn::GroupNorm>();
        auto* batch = stemNorm.ptr()->as<nn::BatchNorm2d>();
        const int64_t groups = group != nullptr ? group->options.num_groups() : std::min<int64_t>(8, channels);
        const int64_t step = (channels + groups - 1) / groups;
        // BatchNorm counts forward passes once for the stem, not once for each slice; the
        // slices update their channels' running statistics through views of the buffers.
        double momentum = 0;
        if (batch != nullptr && batch->is_training() && batch->options.track_running_stats()) {
            torch::NoGradGuard noGrad;
            batch->num_batches_tracked += 1;
            momentum = batch->options.momentum().has_value() ? *batch->options.momentum()
                                                             : 1.0 / batch->num_batches_tracked.item<double>();
        }
        std::vector<torch::Tensor> parameters = stem->parameters();
        std::vector<torch::Tensor> buffers;
        for (const auto& p : stemNorm.ptr()->parameters()) parameters.push_back(p);
        for (const auto& b : stemNorm.ptr()->buffers()) buffers.push_back(b);
        std::vector<torch::Tensor> slices;
        for (int64_t from = 0; from < channels; from += step) {
            const int64_t count = std::min(step, channels - from);
            slices.push_back(checkpointed(
                [=, this](const torch::Tensor& in) {
                    const torch::Tensor s =
                        torch::conv2d(in, stem->weight.narrow(0, from, count), {}, stem->options.stride(),
                                      /*padding=*/{1, 1}, stem->options.dilation());
                    const auto slice = [&](const torch::Tensor& t) {
                        return t.defined() ? t.narrow(0, from, count) : t;
                    };
                    const auto norm = [&](const torch::Tensor& t) {
                        if (group != nullptr) {
                            return torch::group_norm(t, /*num_groups=*/1, slice(group->weight), slice(group->bias),
                                                     group->options.eps());
                        }
                        const bool statistics = batch->options.track_running_stats();
                        return torch::batch_norm(t, slice(batch->weight), slice(batch->bias),
                                                 statistics ? slice(batch->running_mean) : torch::Tensor(),
                                                 statistics ? slice(batch->running_var) : torch::Tensor(),
                                                 batch->is_training() || !statistics, momentum, batch->options.eps(),
                                                 /*cudnn_enabled=*/true);
                    };
                    return torch::max_pool2d(torch::relu(normalisedBy(norm, s)), /*kernel_size=*/4);
                },
                x, parameters, buffers));
        }
        return torch::cat(slices, /*dim=*/1);
    }

    nn::Conv2d stem;
    nn::AnyModule stemNorm;
    nn::Sequential blocks;
    nn::Linear out;
};

template <typename Impl, typename... Args>
std::shared_ptr<Model> wrap(const std::string& name, Args&&... args) {
    auto module = std::make_shared<Impl>(std::forward<Args>(args)...);
    return std::make_shared<ModuleModel>(
        name, module, [raw = module.get()](const torch::Tensor& x) { return raw->forward(x); },
        [raw = module.get()](bool on) { raw->checkpointing = on; });
}

}  // namespace

tl::expected<std::shared_ptr<Model>, std::string> makeBuiltinModel(const ModelOptions& options,
                                                                   std::vector<int64_t> inputShape, int64_t classes) {
    if (options.width < 8) {
        return tl::unexpected("model width " + std::to_string(options.width) + " is too small: use 8 or more");
    }
    if (options.name == "mlp") {
        int64_t inputs = 1;
        for (int64_t d : inputShape) inputs *= d;
        return wrap<MlpImpl>("mlp", inputs, 8 * options.width, classes);
    }
    if (options.name == "cnn" || options.name == "resnet") {
        if (inputShape.size() != 3) {
            return tl::unexpected("model \"" + options.name + "\" needs image inputs [C, H, W]; the data has " +
                                  std::to_string(inputShape.size()) + " dimension(s): use --model mlp");
        }
        if (options.name == "cnn") {
            return wrap<SmallCnnImpl>("cnn", inputShape[0], options.width, classes);
        }
        return wrap<ResNetImpl>(options.norm == NormKind::Batch ? "resnet (BatchNorm)" : "resnet", inputShape[0],
                                options.width, classes, options.norm);
    }
    return tl::unexpected("unknown model \"" + options.name + "\": choose " + choiceList(builtinModelNames()));
}

}  // namespace batchpilot::core
