#include "core/nn/loss.h"

#include <sstream>
#include <stdexcept>

namespace batchpilot::core {
std::string shapeText(const torch::Tensor& t) {
    std::ostringstream out;
    out << '[';
    for (int64_t d = 0; d < t.dim(); ++d) out << (d ? ", " : "") << t.size(d);
    out << ']';
    return out.str();
}

torch::Tensor computeLoss(LossKind kind, const torch::Tensor& lowOrFullOutput, const torch::Tensor& target) {
    const torch::Tensor output = lowOrFullOutput.is_floating_point() && lowOrFullOutput.scalar_type() != torch::kFloat
                                     ? lowOrFullOutput.to(torch::kFloat)
                                     : lowOrFullOutput;
    if (kind == LossKind::CrossEntropy) {
        if (target.is_floating_point() && !target.sizes().equals(output.sizes())) {
            throw std::invalid_argument("cross-entropy needs class ids, but the targets are float values " +
                                        shapeText(target) + " (regression data): use the mse loss");
        }
        if (!target.is_floating_point() &&
            (output.dim() != 2 || target.dim() != 1 || output.size(0) != target.size(0))) {
            throw std::invalid_argument("cross-entropy needs outputs [N, classes] and class ids [N]; the model gave " +
                                        shapeText(output) + " for targets " + shapeText(target) +
                                        ": make the model output one score per class");
        }
        return torch::nn::functional::cross_entropy(output, target);
    }
    torch::Tensor expected = target;
    if (!target.is_floating_point()) {
        if (output.dim() != 2 || target.dim() != 1 || output.size(0) != target.size(0)) {
            throw std::invalid_argument("mse with class-id targets " + shapeText(target) +
                                        " needs outputs [N, classes]; the model gave " + shapeText(output));
        }
        expected = torch::one_hot(target, output.size(1)).to(output.scalar_type());
    } else if (!target.sizes().equals(output.sizes())) {
        if (target.numel() != output.numel() || output.dim() == 0 || output.size(0) != target.size(0)) {
            throw std::invalid_argument("mse needs outputs of the targets' shape " + shapeText(target) +
                                        "; the model gave " + shapeText(output) +
                                        ": make the model output one value per target");
        }
        expected = target.reshape(output.sizes());
    }
    return torch::mse_loss(output, expected.to(output.scalar_type()));
}

}  // namespace batchpilot::core
