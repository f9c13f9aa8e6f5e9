#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tl/expected.hpp>
#include <torch/torch.h>

#include "core/config/options.h"

namespace batchpilot::core {

/// SGD with momentum, Adam and AdamW with the same update rules as torch::optim (1.13), split in
/// two phases so that an out-of-memory error can never leave the parameters half-updated:
/// prepare() allocates everything the step needs (and may throw an OOM), apply() then updates
/// in place and allocates nothing on the device.
///
/// Gradients are passed in (the trainer's accumulators) rather than read from `.grad`.
/// Thread rules: use on the trainer thread only.
class Optimizer {
public:
    Optimizer(const OptimizerOptions& options, std::vector<torch::Tensor> parameters);

    /// Bytes of state the optimizer keeps between steps (momentum, moments). Used to reserve
    /// memory during the first probe, before the state exists. The per-step scratch is not
    /// included: it only exists during the step, when no activations are alive.
    int64_t stateBytes() const;
    /// Uninitialised tensors shaped as the state will be (one per parameter and slot): what the
    /// first probe holds back. One block of stateBytes() would be placed otherwise by a caching
    /// allocator (a GPU's): in one segment, where the state's tensors take blocks of their own.
    std::vector<torch::Tensor> reserveState() const;
    /// True once prepare() succeeded at least once.
    bool stateReady() const { return m_ready; }

    /// Creates lazily-made state and per-step scratch. May throw an OOM; changes no parameter.
    void prepare();
    /// One update with `gradients` (same order and shapes as the parameters). Call after a
    /// successful prepare(). Modifies `gradients` in place where weight decay is folded in.
    void apply(std::vector<torch::Tensor>& gradients);
    /// Frees per-step scratch (kept state stays).
    void releaseScratch() { m_scratch = torch::Tensor(); }

    double learningRate() const { return m_options.learningRate; }
    void setLearningRate(double rate) { m_options.learningRate = rate; }
    int64_t stepCount() const { return m_steps; }
    /// Moves the state to `device` (parameters are moved by the model).
    void to(const torch::Device& device, std::vector<torch::Tensor> parameters);
    /// The state tensors (momentum buffers or first and second moments), for tests and moves.
    const std::vector<torch::Tensor>& firstState() const { return m_first; }
    const std::vector<torch::Tensor>& secondState() const { return m_second; }
    /// Whether saved state could be this optimizer's: per slot either none (no step yet) or one
    /// tensor per parameter, of its shape and dtype, strided and finite; Adam's and AdamW's two
    /// slots both or neither, their squared-gradient averages at least 0; where state exists, a
    /// step count of at least 1 (Adam divides by 1 - beta^steps). The message names the tensor
    /// as a checkpoint does ("second3": the second slot of parameter 3) and what it holds.
    tl::expected<void, std::string> checkState(const std::vector<torch::Tensor>& first,
                                               const std::vector<torch::Tensor>& second, int64_t steps) const;
    /// Replaces the state with saved tensors and step count that passed checkState().
    void restore(std::vector<torch::Tensor> first, std::vector<torch::Tensor> second, int64_t steps);
    OptimizerKind kind() const { return m_options.kind; }

private:
    /// State tensors per parameter: SGD's momentum buffer (with momentum), Adam's two moments.
    int stateSlots() const;

    OptimizerOptions m_options;
    std::vector<torch::Tensor> m_parameters;
    std::vector<torch::Tensor> m_first;   ///< SGD momentum buffer or Adam exp_avg
    std::vector<torch::Tensor> m_second;  ///< Adam exp_avg_sq
    torch::Tensor m_scratch;              ///< Adam denominators, flat, largest parameter's size
    int64_t m_steps = 0;
    bool m_ready = false;
};

}  // namespace batchpilot::core
