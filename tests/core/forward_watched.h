#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "core/nn/model.h"

namespace batchpilot::tests {

/// A model that calls `before(input)` ahead of each forward pass; everything else is the
/// wrapped model's (its checkpointing too). Tests use it to act at a forward pass: stop the run,
/// advance a clock of their own.
class ForwardWatched : public core::Model {
public:
    ForwardWatched(std::shared_ptr<core::Model> inner, std::function<void(const torch::Tensor&)> before)
        : m_inner(std::move(inner)), m_before(std::move(before)) {}
    std::string name() const override { return m_inner->name(); }
    torch::Tensor forward(const torch::Tensor& input) override {
        m_before(input);
        return m_inner->forward(input);
    }
    std::vector<torch::Tensor> parameters() const override { return m_inner->parameters(); }
    std::vector<torch::Tensor> buffers() const override { return m_inner->buffers(); }
    void to(const torch::Device& device) override { m_inner->to(device); }
    void train(bool on) override { m_inner->train(on); }
    bool usesBatchStatistics() const override { return m_inner->usesBatchStatistics(); }
    std::string checkpointingUnsupported() const override { return m_inner->checkpointingUnsupported(); }
    void setCheckpointing(bool on) override { m_inner->setCheckpointing(on); }

private:
    std::shared_ptr<core::Model> m_inner;
    std::function<void(const torch::Tensor&)> m_before;
};

}  // namespace batchpilot::tests
