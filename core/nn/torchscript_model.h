#pragma once

#include <memory>
#include <string>
#include <vector>

#include <tl/expected.hpp>
#include <torch/script.h>
#include <torch/torch.h>

#include "core/nn/model.h"

namespace batchpilot::core {

class Dataset;

/// A model exported from Python with `torch.jit.script(model).save("model.pt")` (or
/// torch.jit.trace), trained through its TorchScript module.
///
/// parameters() are the module's parameters that require gradients, recursively, in the
/// module's order; buffers() its buffers (BatchNorm running statistics). forward() calls the
/// module's `forward` with the input tensor and expects one tensor back.
///
/// Activation checkpointing (memory savers) needs parts to recompute: a module whose forward only
/// calls its top-level children one after another, each on the previous one's output (as
/// nn.Sequential, or `self.head(self.body(self.stem(x)))`; a forward that only calls one child
/// looks inside that child), checkpoints each child; any other forward cannot be split, and
/// checkpointingUnsupported() says what it found.
///
/// Thread rules: create and use on the trainer thread only.
class TorchScriptModel : public Model {
public:
    TorchScriptModel(std::string path, torch::jit::Module module);

    /// "TorchScript <file name>".
    std::string name() const override;
    /// Throws std::runtime_error when forward returns something other than a tensor.
    torch::Tensor forward(const torch::Tensor& input) override;
    std::vector<torch::Tensor> parameters() const override;
    std::vector<std::string> parameterNames() const override;
    std::vector<std::string> bufferNames() const override;
    std::vector<torch::Tensor> buffers() const override;
    void to(const torch::Device& device) override;
    void train(bool on) override;
    /// True when a submodule's type is a BatchNorm (by its TorchScript type name).
    bool usesBatchStatistics() const override;
    std::string checkpointingUnsupported() const override { return m_chainProblem; }
    void setCheckpointing(bool on) override { m_checkpointing = on && m_chainProblem.empty(); }

    const std::string& path() const { return m_path; }
    /// The children forward calls in a chain (their attribute names; "net.0" inside a module
    /// whose forward only calls its child net), or empty.
    const std::vector<std::string>& chain() const { return m_chain; }

private:
    std::string m_path;
    mutable torch::jit::Module m_module;  // its accessors are not const-qualified
    std::vector<std::string> m_chain;
    std::string m_chainProblem;  ///< why forward is not such a chain; empty when it is
    bool m_checkpointing = false;
};

/// Loads the TorchScript file at `path` onto the CPU and checks it against `data` with one
/// sample: the output must be [1, classes] for class-id targets, or the target's shape for
/// float (regression) targets. Errors name the file and the problem: a missing file, a file that
/// is not TorchScript, no trainable parameters, a forward that needs more than the input, a
/// forward that fails on the sample or returns the wrong shape. An out-of-memory during the
/// check is rethrown so the trainer can report it as one.
tl::expected<std::shared_ptr<Model>, std::string> loadTorchScriptModel(const std::string& path, const Dataset& data);

}  // namespace batchpilot::core
