#pragma once

#include <memory>
#include <string>
#include <vector>

#include <tl/expected.hpp>
#include <torch/torch.h>

#include "core/config/options.h"

namespace batchpilot::core {

class Dataset;

/// A trainable model as the trainer sees it: a forward function and its tensors. Built-in models
/// wrap a torch::nn::Module; later model sources (TorchScript files) implement the same interface.
///
/// Thread rules: create and use on the trainer thread only.
class Model {
public:
    virtual ~Model() = default;
    virtual std::string name() const = 0;
    /// Forward pass on a batch of inputs; returns logits [N, classes].
    virtual torch::Tensor forward(const torch::Tensor& input) = 0;
    /// Trainable parameters, in a stable order.
    virtual std::vector<torch::Tensor> parameters() const = 0;
    /// A name per parameter, in the order of parameters() ("fc1.weight"); by default
    /// "parameter 0", "parameter 1", ...
    virtual std::vector<std::string> parameterNames() const;
    /// Non-trainable state updated by forward (BatchNorm running statistics).
    virtual std::vector<torch::Tensor> buffers() const = 0;
    /// A name per buffer, in the order of buffers() ("bn1.running_mean"); by default "buffer 0", ...
    virtual std::vector<std::string> bufferNames() const;
    virtual void to(const torch::Device& device) = 0;
    virtual void train(bool on) = 0;
    /// True when a layer normalises over the batch, so micro-batches change its statistics.
    virtual bool usesBatchStatistics() const = 0;

    /// Activation checkpointing (core/nn/activation_checkpoint.h, the option memory_savers): an
    /// empty string when the model can run its parts without keeping their activations and
    /// recompute them in backward, else why it cannot, for a message.
    virtual std::string checkpointingUnsupported() const {
        return "its forward is a single function that cannot be split into parts to recompute";
    }
    /// Turns checkpointing on or off from the next forward pass (ignored when unsupported).
    virtual void setCheckpointing(bool /*on*/) {}

    /// Number of trainable scalars.
    int64_t parameterCount() const;
    /// Bytes held by the parameters.
    int64_t parameterBytes() const;
};

/// Wraps any torch::nn::Module with a forward function.
class ModuleModel : public Model {
public:
    using Forward = std::function<torch::Tensor(const torch::Tensor&)>;
    /// `checkpointing`, when given, turns the module's activation checkpointing on and off.
    ModuleModel(std::string name, std::shared_ptr<torch::nn::Module> module, Forward forward,
                std::function<void(bool)> checkpointing = {});

    std::string name() const override { return m_name; }
    torch::Tensor forward(const torch::Tensor& input) override { return m_forward(input); }
    std::vector<torch::Tensor> parameters() const override;
    std::vector<std::string> parameterNames() const override;
    std::vector<torch::Tensor> buffers() const override;
    std::vector<std::string> bufferNames() const override;
    void to(const torch::Device& device) override;
    void train(bool on) override;
    bool usesBatchStatistics() const override;
    std::string checkpointingUnsupported() const override;
    void setCheckpointing(bool on) override;

private:
    std::string m_name;
    std::shared_ptr<torch::nn::Module> m_module;
    Forward m_forward;
    std::function<void(bool)> m_checkpointing;
};

/// Builds "mlp", "cnn" or "resnet" for inputs of shape [C, H, W] and `classes` outputs. Each
/// can checkpoint its activations: the MLP per hidden layer, the CNN per convolution stage, the
/// ResNet per residual block and its stem. The
/// current torch seed decides the initial weights. Unknown names are an error listing the valid
/// ones.
tl::expected<std::shared_ptr<Model>, std::string> makeBuiltinModel(const ModelOptions& options,
                                                                   std::vector<int64_t> inputShape, int64_t classes);

}  // namespace batchpilot::core
