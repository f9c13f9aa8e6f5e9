#include "core/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/base/text_format.h"
#include "core/device/counting_allocator.h"

namespace batchpilot::core {
namespace {

int64_t bytesOf(const torch::Tensor& t) {
    return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
}

}  // namespace

Optimizer::Optimizer(const OptimizerOptions& options, std::vector<torch::Tensor> parameters)
    : m_options(options), m_parameters(std::move(parameters)) {}

int Optimizer::stateSlots() const {
    if (m_options.kind == OptimizerKind::Sgd) return m_options.momentum > 0 ? 1 : 0;
    return 2;  // Adam, AdamW: exp_avg and exp_avg_sq
}

int64_t Optimizer::stateBytes() const {
    int64_t total = 0;
    for (const auto& p : m_parameters) total += bytesOf(p);
    return stateSlots() * total;
}

std::vector<torch::Tensor> Optimizer::reserveState() const {
    std::vector<torch::Tensor> held;
    // In prepare()'s order: each parameter's slots in turn.
    for (const auto& p : m_parameters)
        for (int slot = 0; slot < stateSlots(); ++slot) held.push_back(torch::empty_like(p));
    return held;
}

void Optimizer::prepare() {
    torch::NoGradGuard noGrad;
    const bool adam = m_options.kind != OptimizerKind::Sgd;
    if (m_first.empty() && stateSlots() > 0) {
        std::vector<torch::Tensor> first;
        std::vector<torch::Tensor> second;
        for (const auto& p : m_parameters) {
            first.push_back(torch::zeros_like(p));
            if (stateSlots() > 1) second.push_back(torch::zeros_like(p));
        }
        // Assign only when every allocation succeeded.
        m_first = std::move(first);
        m_second = std::move(second);
    }
    if (adam && !m_scratch.defined()) {
        int64_t largest = 0;
        for (const auto& p : m_parameters) {
            largest = std::max<int64_t>(largest, p.numel());
        }
        m_scratch = torch::empty({largest}, m_parameters.front().options());
    }
    m_ready = true;
}

void Optimizer::apply(std::vector<torch::Tensor>& gradients) {
    torch::NoGradGuard noGrad;
    // Scalar arguments can make LibTorch allocate tiny wrapper tensors; they must not count
    // against (or fail on) the virtual device mid-update.
    CountingScope uncounted(false);
    const double lr = m_options.learningRate;
    const double wd = m_options.weightDecay;
    ++m_steps;
    if (m_options.kind == OptimizerKind::Sgd) {
        for (size_t i = 0; i < m_parameters.size(); ++i) {
            auto& p = m_parameters[i];
            auto& g = gradients[i];
            if (wd != 0) {
                g.add_(p, wd);
            }
            if (m_options.momentum > 0) {
                auto& buffer = m_first[i];
                if (m_steps == 1) {
                    buffer.copy_(g);
                } else {
                    buffer.mul_(m_options.momentum).add_(g);
                }
                p.add_(buffer, -lr);
            } else {
                p.add_(g, -lr);
            }
        }
        return;
    }
    const double b1 = m_options.beta1;
    const double b2 = m_options.beta2;
    const double correction1 = 1.0 - std::pow(b1, static_cast<double>(m_steps));
    const double correction2 = 1.0 - std::pow(b2, static_cast<double>(m_steps));
    const double stepSize = lr / correction1;
    const double sqrtCorrection2 = std::sqrt(correction2);
    for (size_t i = 0; i < m_parameters.size(); ++i) {
        auto& p = m_parameters[i];
        auto& g = gradients[i];
        if (m_options.kind == OptimizerKind::AdamW) {
            p.mul_(1.0 - lr * wd);
        } else if (wd != 0) {
            g.add_(p, wd);
        }
        m_first[i].mul_(b1).add_(g, 1.0 - b1);
        m_second[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
        auto denominator = m_scratch.narrow(0, 0, p.numel()).view(p.sizes());
        denominator.copy_(m_second[i]).sqrt_().div_(sqrtCorrection2).add_(m_options.epsilon);
        p.addcdiv_(m_first[i], denominator, -stepSize);
    }
}

tl::expected<void, std::string> Optimizer::checkState(const std::vector<torch::Tensor>& first,
                                                      const std::vector<torch::Tensor>& second, int64_t steps) const {
    const bool adam = m_options.kind != OptimizerKind::Sgd;
    const std::string kind = toString(m_options.kind);
    // apply() indexes both slots by parameter: a torn state would be read past its end.
    if (adam && first.size() != second.size()) {
        return tl::unexpected("firstcount is " + std::to_string(first.size()) + " but secondcount is " +
                              std::to_string(second.size()) + ": " + kind +
                              " keeps both moving averages for every parameter, or neither before its first step");
    }
    if (!adam && !second.empty())
        return tl::unexpected("secondcount: expected 0 (sgd keeps one state tensor per parameter), got " +
                              std::to_string(second.size()));
    // State is made by the first step: a count of 0 beside it would divide by 1 - beta^0 = 0.
    if (!first.empty() && steps < 1) {
        return tl::unexpected("optimizer_steps: expected an integer from 1 up where the " + kind +
                              " state exists (it was made by a step), got " + std::to_string(steps));
    }
    for (size_t i = 0; adam && i < second.size(); ++i) {
        if (second[i].numel() == 0) continue;
        const double lowest = second[i].min().item<double>();
        if (lowest < 0) {
            return tl::unexpected("second" + std::to_string(i) + ": expected values of at least 0 (" + kind +
                                  "'s average of squared gradients), got " + formatText("%g", lowest));
        }
    }
    return {};
}

void Optimizer::restore(std::vector<torch::Tensor> first, std::vector<torch::Tensor> second, int64_t steps) {
    m_first = std::move(first);
    m_second = std::move(second);
    m_steps = steps;
    m_ready = false;  // prepare() still makes the per-step scratch
}

void Optimizer::to(const torch::Device& device, std::vector<torch::Tensor> parameters) {
    m_parameters = std::move(parameters);
    for (auto& t : m_first) t = t.to(device);
    for (auto& t : m_second) t = t.to(device);
    if (m_scratch.defined()) m_scratch = m_scratch.to(device);
}

}  // namespace batchpilot::core
