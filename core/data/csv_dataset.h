#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tl/expected.hpp>
#include <torch/torch.h>

#include "core/data/dataset.h"

namespace batchpilot::core {

/// Tabular data from a CSV file for MLPs: a header row naming the columns, then one sample per
/// row. Fields are separated by commas and may be quoted ("a, b", "" for a quote); blank lines
/// are skipped.
///
/// One named column is the target; every other column is a numeric feature, standardised over
/// the file (zero mean, unit variance per column; a constant column becomes 0), so inputs are
/// [F] floats. Classification: when every target is a whole number ≥ 0 it is the class id
/// (classes() = largest + 1); signed whole numbers (-1/1) map to ids in numeric order, names to
/// ids in sorted order (classNames() gives the mapping); fractional numbers are an error that
/// points to regression. Regression: targets are float [1] values, for MSE.
///
/// Thread rules: immutable after load(); get() may be called from any thread, also concurrently.
class CsvDataset : public Dataset {
public:
    /// Reads `path`. Errors name the file and, for a bad row, its line number and column: a
    /// missing target column lists the columns there are.
    static tl::expected<std::shared_ptr<CsvDataset>, std::string> load(const std::string& path,
                                                                       const std::string& targetColumn,
                                                                       bool regression);

    std::string name() const override;
    std::string fingerprint() const override { return m_fingerprint; }
    int64_t size() const override { return m_features.size(0); }
    std::vector<int64_t> sampleShape() const override { return {m_features.size(1)}; }
    /// Classes for classification; 1 (the target's width) for regression.
    int64_t classes() const override { return m_classes; }
    Batch get(const std::vector<int64_t>& indices) const override;
    std::vector<std::string> classNames() const override { return m_classNames; }

    /// Feature column names, in input order.
    const std::vector<std::string>& featureNames() const { return m_featureNames; }
    bool regression() const { return m_regression; }
    /// Standardises this file's features with `reference`'s column statistics instead of its own
    /// (validation data must be scaled as the training data was). The feature columns must be
    /// the same, by name and order; an error says which differ.
    tl::expected<void, std::string> standardiseLike(const CsvDataset& reference);

private:
    CsvDataset() = default;

    std::string m_path;
    std::string m_fingerprint;  ///< the file's name and its content's CRC-32
    std::string m_target;
    bool m_regression = false;
    std::vector<std::string> m_featureNames;
    std::vector<std::string> m_classNames;
    int64_t m_classes = 0;
    /// Per feature column, how it was standardised: x' = (x / scale - mean) / deviation (0 when
    /// the column was constant).
    struct Standardisation {
        double scale = 1;
        double mean = 0;
        double deviation = 0;
    };
    std::vector<Standardisation> m_standardisation;
    torch::Tensor m_features;  ///< float [N, F], standardised
    torch::Tensor m_targets;   ///< int64 [N] or float [N, 1]
};

}  // namespace batchpilot::core
