#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tl/expected.hpp>
#include <torch/torch.h>

#include "core/data/dataset.h"

namespace batchpilot::core {

/// MNIST-style data from IDX files: `train-images-idx3-ubyte` (unsigned bytes, [N, rows, cols])
/// and `train-labels-idx1-ubyte` ([N] class ids), each plain or gzipped (`.gz`). Works for any
/// IDX pair with these layouts (Fashion-MNIST, KMNIST, ...).
///
/// Inputs are [1, rows, cols] floats: pixel/255, then normalised with the MNIST mean 0.1307 and
/// standard deviation 0.3081. Targets are the labels; classes() is the largest label + 1.
/// The whole file is held as bytes (60 000 MNIST images: 47 MB).
///
/// Thread rules: immutable after load(); get() may be called from any thread, also concurrently.
class MnistDataset : public Dataset {
public:
    static constexpr double kMean = 0.1307;
    static constexpr double kStd = 0.3081;

    /// Reads the pair from `path`: a folder holding `train-images-idx3-ubyte[.gz]` and
    /// `train-labels-idx1-ubyte[.gz]`, or the path of an images file `<prefix>images-idx3-ubyte[.gz]`
    /// whose labels are the `<prefix>labels-idx1-ubyte[.gz]` next to it (e.g. the `t10k-` test
    /// split). Magic numbers, counts, dimensions and file sizes are checked; a failure names the
    /// file and what is wrong with it.
    static tl::expected<std::shared_ptr<MnistDataset>, std::string> load(const std::string& path);

    std::string name() const override;
    std::string fingerprint() const override { return m_fingerprint; }
    int64_t size() const override { return m_labels.size(0); }
    std::vector<int64_t> sampleShape() const override { return {1, m_images.size(1), m_images.size(2)}; }
    int64_t classes() const override { return m_classes; }
    Batch get(const std::vector<int64_t>& indices) const override;

private:
    MnistDataset(std::string imagesPath, torch::Tensor images, torch::Tensor labels, int64_t classes);

    std::string m_imagesPath;
    std::string m_fingerprint;  ///< the images file's name and the CRC-32 of the images and labels
    torch::Tensor m_images;     ///< uint8 [N, rows, cols]
    torch::Tensor m_labels;     ///< int64 [N]
    int64_t m_classes = 0;
};

/// Reads a whole file, gunzipping it when it is gzip-compressed (plain files are read as they
/// are). A missing, unreadable or truncated file is an error naming it.
/// Reads at most `maxBytes` + 1 bytes: one more than asked tells the caller the file holds more.
tl::expected<std::vector<uint8_t>, std::string> readMaybeGzipped(const std::string& path,
                                                                 uint64_t maxBytes = UINT64_MAX);

}  // namespace batchpilot::core
