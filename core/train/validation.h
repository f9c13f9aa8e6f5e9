#pragma once

// Held-out data and what is measured on it: the deterministic split of a data set into training
// and validation samples, a view of a data set through a list of indices, and the sums a
// validation pass adds up micro-batch by micro-batch (loss, top-1/top-5 accuracy, MSE/MAE).
// The trainer's validation pass itself is in trainer_validation.cpp.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tl/expected.hpp>
#include <torch/torch.h>

#include "core/data/dataset.h"
#include "core/config/options.h"
#include "core/events/events.h"

namespace batchpilot::core {

/// The samples of `base` at `indices` (each in [0, base.size())), in that order: sample i of the
/// view is sample indices[i] of the base. Thread rules: those of the base (get() from any thread).
class SubsetDataset : public Dataset {
public:
    SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices, std::string name);
    std::string name() const override { return m_name; }
    int64_t size() const override { return static_cast<int64_t>(m_indices.size()); }
    std::vector<int64_t> sampleShape() const override { return m_base->sampleShape(); }
    int64_t classes() const override { return m_base->classes(); }
    Batch get(const std::vector<int64_t>& indices) const override;
    std::vector<std::string> warnings() const override { return m_base->warnings(); }
    std::vector<std::string> classNames() const override { return m_base->classNames(); }
    /// The base's, and which of its samples the view holds.
    std::string fingerprint() const override;
    /// The base data set's index of each sample of the view.
    const std::vector<int64_t>& baseIndices() const { return m_indices; }

private:
    std::shared_ptr<const Dataset> m_base;
    std::vector<int64_t> m_indices;
    std::string m_name;
};

/// How many of `size` samples a share of `share` holds out: round(share · size), at least 1 when
/// the share is positive, and never all of them (training keeps at least one). 0 for share 0.
int64_t heldOutCount(int64_t size, double share);

/// The indices of [0, size) held out for validation: heldOutCount(size, share) of them, drawn
/// from `seed` alone (the same seed always holds out the same samples), sorted.
std::vector<int64_t> heldOutIndices(int64_t size, double share, uint64_t seed);

/// A data set split into the samples training uses and the samples it never sees.
struct TrainValidation {
    std::shared_ptr<Dataset> training;
    std::shared_ptr<Dataset> validation;  ///< null when nothing is held out
};

/// Splits `data` by heldOutIndices(size, share, seed); the rest, in their original order, train.
TrainValidation splitHeldOut(const std::shared_ptr<Dataset>& data, double share, uint64_t seed);

/// The validation data `options` ask for, next to `training` (already loaded from options.data):
///  - validation.path: that file or folder, read in the training data's format; its sample shape
///    and classes must match the training data's (a message says which differs);
///  - otherwise a share (validation.split, default 0.1): for synthetic data `share · samples`
///    extra samples of the same generator (indices from `samples` on), so training keeps all
///    of its samples; for data read from files that share of the samples, held out from training.
/// Returns the training data (the same object unless a share was held out) and the validation
/// data (null for a share of 0). Data given through TrainerOptions::datasetFactory is split only
/// when validation.split is set.
tl::expected<TrainValidation, std::string> makeValidation(const TrainerOptions& options,
                                                          std::shared_ptr<Dataset> training);

/// What a validation pass adds up, micro-batch by micro-batch, so that the result does not depend
/// on how the held-out samples were split (sums, divided at the end).
///
/// Classification (int64 class-id targets [N] against [N, classes] outputs): the loss, top-1
/// correct, and top-5 correct when there are more than 5 classes. Regression (float targets):
/// the loss, squared and absolute errors.
class ValidationTotals {
public:
    explicit ValidationTotals(LossKind loss) : m_loss(loss) {}
    /// Adds one micro-batch: `output` is the model's, `targets` the data's.
    void add(const torch::Tensor& output, const torch::Tensor& targets);

    int64_t samples() const { return m_samples; }
    double meanLoss() const;
    /// Top-1 accuracy in [0, 1]; -1 when the targets are not class ids.
    double accuracy() const;
    /// Top-5 accuracy in [0, 1]; -1 when not class ids or 5 classes or fewer.
    double top5Accuracy() const;
    /// Mean squared / absolute error over every target value; -1 when the targets are class ids.
    double meanSquaredError() const;
    double meanAbsoluteError() const;
    /// The pass's figures as its report: the samples, the loss, the accuracies and errors (the
    /// caller adds when, at which step and at which micro-batch).
    ValidationDone done() const;

private:
    LossKind m_loss;
    int64_t m_samples = 0;
    double m_lossSum = 0;
    bool m_classification = false;
    bool m_regression = false;
    bool m_top5 = false;
    int64_t m_correct = 0;
    int64_t m_correct5 = 0;
    int64_t m_values = 0;  ///< regression: target values counted
    double m_squared = 0;
    double m_absolute = 0;
};

}  // namespace batchpilot::core
