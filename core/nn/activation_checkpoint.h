#pragma once

// Activation checkpointing for LibTorch's C++ API, which has none (pytorch issue #52744): a
// segment of a model runs forward without keeping its activations for backward; backward runs the
// segment again, with gradients, and back-propagates through that recomputation. Memory for
// activations then grows with one segment's activations plus each segment's input, instead of
// with every layer's; the price is a second forward pass of each segment (issue 15).

#include <functional>
#include <vector>

#include <torch/torch.h>

namespace batchpilot::core {

/// A part of a model: input to output, using the parameters and buffers passed along with it.
using Segment = std::function<torch::Tensor(const torch::Tensor&)>;

/// `segment(input)`, with its activations recomputed in backward instead of kept.
///
/// `parameters`: every trainable tensor the segment uses (their gradients come from the
/// recomputation; one left out gets none). `buffers`: the state the segment updates as it runs
/// forward (BatchNorm's running statistics and batch counter); they are put back after the
/// recomputation, so that they are updated once per forward pass, as without checkpointing.
///
/// Gradients equal the ones without checkpointing when the segment computes the same thing
/// twice: deterministic layers, and random ones (dropout) only with the CPU generator, whose
/// state is restored for the recomputation (CUDA's is not). The recomputation autocasts as
/// forward did (bfloat16 autocast, core/config/memory_savers.h). Without grad mode, or when nothing
/// the segment depends on requires a gradient, it is a plain call.
torch::Tensor checkpointed(const Segment& segment, const torch::Tensor& input,
                           const std::vector<torch::Tensor>& parameters,
                           const std::vector<torch::Tensor>& buffers = {});

/// The CPU generator's state (random layers such as dropout draw from it), taken and put back
/// under its lock: what a recomputation, or a measurement that must leave the run's random stream
/// as it found it, saves first.
torch::Tensor cpuGeneratorState();
void setCpuGeneratorState(const torch::Tensor& state);

}  // namespace batchpilot::core
