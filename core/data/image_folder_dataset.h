#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tl/expected.hpp>
#include <torch/torch.h>

#include "core/data/dataset.h"

namespace batchpilot::core {

/// Images in the torchvision ImageFolder layout: `root/<class>/**/<image>`, one subfolder per
/// class, class ids in sorted subfolder-name order (as torchvision assigns them). PNG files are
/// decoded with libpng, JPEG with libjpeg-turbo, binary PGM/PPM (8 or 16 bits) by BatchPilot,
/// BMP, GIF (first frame) and TGA with stb_image; other files are ignored and counted in a
/// warning, as are hidden ones (names starting with "."). An image larger than 8192 x 8192
/// pixels, or a BMP/GIF/TGA claiming more pixels than its file can hold, is skipped before it is
/// decoded.
///
/// Every image is decoded once at load, converted to DataOptions::channels (3: RGB, 1: grey),
/// resized (stretched) to height x width, and kept as bytes when the whole set fits
/// DataOptions::imageCacheBytes; otherwise get() decodes the files again. Files that cannot be
/// decoded are skipped and listed in warnings(). Inputs are [C, H, W] floats: pixel/255, then
/// normalised per channel with the ImageNet mean and standard deviation (grey: their averages).
///
/// Thread rules: immutable after load(); get() may be called from any thread, also concurrently.
class ImageFolderDataset : public Dataset {
public:
    static constexpr std::array<float, 3> kMean = {0.485F, 0.456F, 0.406F};
    static constexpr std::array<float, 3> kStd = {0.229F, 0.224F, 0.225F};

    /// Reads `options.path`, resizing to options.channels x height x width. A missing or empty
    /// folder, one without class subfolders, and one where no image could be read are errors.
    static tl::expected<std::shared_ptr<ImageFolderDataset>, std::string> load(const DataOptions& options);

    std::string name() const override;
    std::string fingerprint() const override { return m_fingerprint; }
    int64_t size() const override { return static_cast<int64_t>(m_files.size()); }
    std::vector<int64_t> sampleShape() const override { return {m_channels, m_height, m_width}; }
    int64_t classes() const override { return static_cast<int64_t>(m_classNames.size()); }
    /// Throws std::runtime_error naming the file when an uncached image can no longer be read.
    Batch get(const std::vector<int64_t>& indices) const override;
    std::vector<std::string> warnings() const override { return m_warnings; }
    std::vector<std::string> classNames() const override { return m_classNames; }

    /// Image files in sample order, and their class ids.
    const std::vector<std::string>& files() const { return m_files; }
    const std::vector<int64_t>& labels() const { return m_labels; }
    /// True when the decoded images are held in memory.
    bool cached() const { return m_cache.defined(); }

private:
    ImageFolderDataset() = default;

    std::string m_root;
    std::string m_fingerprint;  ///< the CRC-32 of every image's path (relative to the root) and size
    int64_t m_channels = 3;
    int64_t m_height = 0;
    int64_t m_width = 0;
    std::vector<std::string> m_classNames;
    std::vector<std::string> m_files;
    std::vector<int64_t> m_labels;
    std::vector<std::string> m_warnings;
    torch::Tensor m_cache;  ///< uint8 [N, C, H, W], or undefined when decoding per get()
};

/// Decodes the image file at `path` into `out` (channels x height x width bytes, planar CHW),
/// converting to `channels` (1 or 3) and resizing to height x width. Thread-safe. The error is
/// the decoder's reason, e.g. "unknown image type" or "JPEG: Premature end of JPEG file".
tl::expected<void, std::string> decodeImage(const std::string& path, int64_t channels, int64_t height, int64_t width,
                                            uint8_t* out);

}  // namespace batchpilot::core
