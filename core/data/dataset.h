#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/config/options.h"

namespace batchpilot::core {

/// A batch of samples on the host: inputs [N, ...] float; targets [N] int64 class labels, or
/// float [N, T] values for regression data (a CSV loaded with DataOptions::regression).
struct Batch {
    torch::Tensor inputs;
    torch::Tensor targets;
};

/// Random-access labelled samples.
///
/// Thread rules: get() may be called from any thread, also concurrently.
class Dataset {
public:
    virtual ~Dataset() = default;
    virtual std::string name() const = 0;
    virtual int64_t size() const = 0;
    /// Shape of one input sample, e.g. {3, 32, 32}.
    virtual std::vector<int64_t> sampleShape() const = 0;
    virtual int64_t classes() const = 0;
    /// The samples at `indices` (each in [0, size())), stacked in that order.
    virtual Batch get(const std::vector<int64_t>& indices) const = 0;
    /// Problems met while loading that did not stop it (e.g. unreadable images that were
    /// skipped), one human sentence each; the trainer reports them as Warning events.
    virtual std::vector<std::string> warnings() const { return {}; }
    /// Class names in class-id order where the data names its classes (image-folder subfolders,
    /// CSV string labels); empty otherwise.
    virtual std::vector<std::string> classNames() const { return {}; }
    /// What tells these samples from others of the same shape and size: another file, other
    /// content or another generator seed gives another fingerprint, so that a run resumed on other
    /// data is refused (Trainer, restoreCheckpoint). Readable, e.g. "CSV prices.csv, content
    /// CRC-32 1a2b3c4d". Empty: unknown (data given by tests), not checked.
    virtual std::string fingerprint() const { return {}; }
};

/// CRC-32 of `size` bytes at `bytes`, continuing from `crc` (0 to start).
uint32_t crc32Of(const void* bytes, size_t size, uint32_t crc = 0);
/// A CRC-32 as 8 hexadecimal digits.
std::string crcText(uint32_t crc);

/// Host memory the synthetic data's class prototypes may take (classes × C×H×W × 4 bytes):
/// makeDataset refuses more, with the cost, before allocating it.
inline constexpr int64_t kMaxSyntheticPrototypeBytes = int64_t{1} << 30;

/// Synthetic image classification: every class has a smooth random prototype image, and a sample
/// is its class prototype plus per-pixel noise. Deterministic from (seed, index): the same
/// sample is produced however and whenever it is asked for. Learnable by all built-in models.
class SyntheticImages : public Dataset {
public:
    explicit SyntheticImages(const DataOptions& options);
    /// The same generator with `samples` samples: the samples both have are the same, and the
    /// prototypes are shared, not made again (held-out samples after the training ones).
    SyntheticImages(const SyntheticImages& generator, int64_t samples)
        : m_options(generator.m_options), m_prototypes(generator.m_prototypes) {
        m_options.samples = samples;
    }
    std::string name() const override;
    std::string fingerprint() const override;
    int64_t size() const override { return m_options.samples; }
    std::vector<int64_t> sampleShape() const override;
    int64_t classes() const override { return m_options.classes; }
    Batch get(const std::vector<int64_t>& indices) const override;

    /// Label of sample `index` (cheap; no image is generated).
    int64_t label(int64_t index) const;

private:
    DataOptions m_options;
    torch::Tensor m_prototypes;  ///< [classes, C, H, W]
};

/// Builds the dataset named in `options`: "synthetic" (generated), "mnist" (IDX files in
/// `options.path`, see mnist_dataset.h), "image-folder" (see image_folder_dataset.h) or "csv"
/// (see csv_dataset.h). Reads files on the calling thread; the message of a failure names the
/// file or value and says what to do. Unknown names are an error listing the valid ones.
tl::expected<std::shared_ptr<Dataset>, std::string> makeDataset(const DataOptions& options);

}  // namespace batchpilot::core
