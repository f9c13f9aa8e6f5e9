#include "core/train/equivalence.h"

#include <cmath>

#include "core/nn/loss.h"
#include "core/nn/model.h"
#include "core/base/text_format.h"

namespace batchpilot::core {
namespace {

/// Copies of the buffers, put back when the scope ends, so a check leaves no trace.
class BufferSnapshot {
public:
    explicit BufferSnapshot(Model& model) : m_model(model) {
        for (const auto& b : model.buffers()) m_saved.push_back(b.clone());
    }
    ~BufferSnapshot() {
        torch::NoGradGuard noGrad;
        auto buffers = m_model.buffers();
        for (size_t i = 0; i < m_saved.size() && i < buffers.size(); ++i) buffers[i].copy_(m_saved[i]);
    }
    BufferSnapshot(const BufferSnapshot&) = delete;
    BufferSnapshot& operator=(const BufferSnapshot&) = delete;

private:
    Model& m_model;
    std::vector<torch::Tensor> m_saved;
};

std::vector<torch::Tensor> gradientOf(Model& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                                      LossKind loss, double weight) {
    const auto parameters = model.parameters();
    torch::Tensor value = computeLoss(loss, model.forward(inputs), targets) * weight;
    auto grads = torch::autograd::grad({value}, parameters, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i) {
        if (!grads[i].defined()) grads[i] = torch::zeros_like(parameters[i]);
    }
    return grads;
}

}  // namespace

std::vector<torch::Tensor> accumulatedGradient(Model& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                                               const std::vector<int64_t>& microBatchSizes, LossKind loss) {
    const int64_t total = inputs.size(0);
    BufferSnapshot restore(model);
    std::vector<torch::Tensor> sum;
    int64_t offset = 0;
    for (const int64_t size : microBatchSizes) {
        const double weight = static_cast<double>(size) / static_cast<double>(total);
        auto grads = gradientOf(model, inputs.narrow(0, offset, size), targets.narrow(0, offset, size), loss, weight);
        torch::NoGradGuard noGrad;
        if (sum.empty()) {
            sum = std::move(grads);
        } else {
            for (size_t i = 0; i < sum.size(); ++i) sum[i].add_(grads[i]);
        }
        offset += size;
    }
    if (offset != total) {
        throw std::invalid_argument("micro-batch sizes add up to " + std::to_string(offset) + ", the batch has " +
                                    std::to_string(total) + " samples");
    }
    return sum;
}

std::vector<torch::Tensor> fullBatchGradient(Model& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                                             LossKind loss, double lossScale) {
    BufferSnapshot restore(model);
    std::vector<torch::Tensor> grads = gradientOf(model, inputs, targets, loss, lossScale);
    if (lossScale != 1.0) {
        torch::NoGradGuard noGrad;
        for (torch::Tensor& g : grads) g.div_(lossScale);
    }
    return grads;
}

void compareGradients(const std::vector<std::string>& names, const std::vector<torch::Tensor>& accumulated,
                      const std::vector<torch::Tensor>& full, EquivalenceChecked& result) {
    torch::NoGradGuard noGrad;
    result.tensors.clear();
    double diffSquares = 0;
    double fullSquares = 0;
    double accSquares = 0;
    double dot = 0;
    double maxAbs = 0;
    int64_t elements = 0;
    for (size_t i = 0; i < accumulated.size() && i < full.size(); ++i) {
        const torch::Tensor a = accumulated[i].detach().to(torch::kCPU, torch::kDouble).flatten();
        const torch::Tensor b = full[i].detach().to(torch::kCPU, torch::kDouble).flatten();
        const torch::Tensor diff = a - b;
        TensorDifference d;
        d.name = i < names.size() ? names[i] : "parameter " + std::to_string(i);
        d.elements = a.numel();
        const double dd = diff.dot(diff).item<double>();
        const double bb = b.dot(b).item<double>();
        const double aa = a.dot(a).item<double>();
        const double ab = a.dot(b).item<double>();
        d.maxAbsDifference = d.elements > 0 ? diff.abs().max().item<double>() : 0.0;
        d.relativeDifference = bb > 0 ? std::sqrt(dd / bb) : (dd > 0 ? INFINITY : 0.0);
        d.cosineSimilarity = aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
        diffSquares += dd;
        fullSquares += bb;
        accSquares += aa;
        dot += ab;
        maxAbs = std::max(maxAbs, d.maxAbsDifference);
        elements += d.elements;
        result.tensors.push_back(std::move(d));
    }
    result.overall.name = "all parameters";
    result.overall.elements = elements;
    result.overall.maxAbsDifference = maxAbs;
    result.overall.relativeDifference =
        fullSquares > 0 ? std::sqrt(diffSquares / fullSquares) : (diffSquares > 0 ? INFINITY : 0.0);
    result.overall.cosineSimilarity = accSquares > 0 && fullSquares > 0 ? dot / std::sqrt(accSquares * fullSquares)
                                                                        : (accSquares == fullSquares ? 1.0 : 0.0);
}

namespace {

/// Why a model with BatchNorm accumulates a gradient other than the full batch's.
std::string batchNormText(const EquivalenceChecked& r, const std::string& rel) {
    std::string text =
        "The model uses BatchNorm: in training mode each micro-batch is normalised with its own mean and "
        "variance, so a sample's output depends on which other samples share its micro-batch. The accumulated "
        "gradient therefore differs from the full-batch gradient (relative difference " +
        rel + ", cosine " + formatText("%.6f", r.overall.cosineSimilarity) +
        "). This is a property of the model, not an error of accumulation";
    if (r.runningStatisticsRelativeDifference >= 0) {
        text +=
            ": with the running statistics instead (evaluation mode, every sample normalised on its own) "
            "the same check gives " +
            formatText("%.2g", r.runningStatisticsRelativeDifference);
    }
    text += ". For exact accumulation use GroupNorm or LayerNorm (built-in models: --norm group). ";
    return text;
}

}  // namespace

std::string explainEquivalence(const EquivalenceChecked& r) {
    const std::string rel = formatText("%.2g", r.overall.relativeDifference);
    // Several devices: every rank's micro-batches, summed over the ranks as a training step sums them.
    const size_t count = microBatchCount(r);
    std::string parts = std::to_string(count) + " micro-batch" + (count == 1 ? "" : "es");
    if (!r.rankMicroBatchSizes.empty())
        parts += " on " + std::to_string(r.rankMicroBatchSizes.size()) + " devices (summed over the ranks)";
    std::string text;
    if (count == 1) {
        text = "The check batch fits in one micro-batch, so both ways run the same computation (relative difference " +
               rel + "). Choose a check batch larger than the micro-batch to see accumulation at work. ";
    } else if (!r.batchStatistics && (r.bfloat16 || r.float16) && !r.equalUpToRounding()) {
        const std::string type = r.bfloat16 ? "bfloat16" : "float16";
        text = "Both ways ran the forward pass under " + type + " autocast (the memory saver " +
               (r.bfloat16 ? "bf16" : "fp16") + "): " + type +
               (r.bfloat16 ? " keeps 8 significant bits, about 2 to 3 decimal digits"
                           : " keeps 11 significant bits, about 3 decimal digits") +
               ", and where its rounding falls depends on which samples share a micro-batch's matrix products. So "
               "the accumulated gradient differs from the full-batch one by " +
               rel + " (cosine " + formatText("%.6f", r.overall.cosineSimilarity) +
               "), far more than float32 rounding (" + formatText("%.0e", kRoundingTolerance) + ") but what " + type +
               " costs, not an error of accumulation: without the memory saver the same check agrees to float32 "
               "rounding. ";
    } else if (!r.batchStatistics) {
        if (r.equalUpToRounding()) {
            text = "Accumulating " + std::to_string(r.samples) + " samples in " + parts +
                   " gives the full-batch gradient: the relative difference is " + rel +
                   ", which is float32 rounding (sums taken in a different order), and the directions agree "
                   "(cosine " +
                   formatText("%.9f", r.overall.cosineSimilarity) +
                   "). Each micro-batch's mean loss is weighted by its share n_i / T of the batch, so the weighted "
                   "sum of the micro-batch gradients is exactly the gradient of the batch's mean loss. ";
        } else {
            text = "The accumulated gradient differs from the full-batch one by " + rel +
                   ", more than float32 rounding explains (" + formatText("%.0e", kRoundingTolerance) +
                   "). The model has no BatchNorm, so look for randomness in its forward pass (dropout) or layers "
                   "that mix samples of a batch. ";
        }
    } else {
        text = batchNormText(r, rel);
    }
    if (r.fullPassOutsideBudget) {
        text += "The full batch of " + std::to_string(r.samples) +
                " samples does not fit in the virtual device's budget — that is why the trainer accumulates — so "
                "the one-pass gradient was computed in host memory outside the budget.";
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    return text;
}

}  // namespace batchpilot::core
