#include "core/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <sstream>

#include <zlib.h>

#include "core/base/byte_size.h"
#include "core/data/csv_dataset.h"
#include "core/data/image_folder_dataset.h"
#include "core/data/mnist_dataset.h"

namespace batchpilot::core {
namespace {

uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/// Uniform in [0, 1).
double unit(uint64_t& state) {
    return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
}

constexpr float kNoise = 0.8F;

}  // namespace

SyntheticImages::SyntheticImages(const DataOptions& options) : m_options(options) {
    const int64_t k = options.classes, c = options.channels, h = options.height, w = options.width;
    m_prototypes = torch::empty({k, c, h, w}, torch::kFloat32);
    float* out = m_prototypes.data_ptr<float>();
    uint64_t state = options.seed * 0x2545F4914F6CDD1DULL + 7;
    constexpr double kTwoPi = 2.0 * std::numbers::pi;
    for (int64_t cls = 0; cls < k; ++cls) {
        for (int64_t ch = 0; ch < c; ++ch) {
            // A colour offset per class and channel plus two smooth waves: learnable by an MLP
            // (offsets) and by convolutions (patterns), at any image size.
            const double offset = unit(state) - 0.5;
            double fx[2], fy[2], phase[2];
            for (int i = 0; i < 2; ++i) {
                fx[i] = (0.5 + 2.5 * unit(state)) * kTwoPi;
                fy[i] = (0.5 + 2.5 * unit(state)) * kTwoPi;
                phase[i] = unit(state) * kTwoPi;
            }
            for (int64_t y = 0; y < h; ++y) {
                for (int64_t x = 0; x < w; ++x) {
                    const double u = static_cast<double>(x) / static_cast<double>(w);
                    const double v = static_cast<double>(y) / static_cast<double>(h);
                    double value = offset;
                    for (int i = 0; i < 2; ++i) value += 0.5 * std::sin(fx[i] * u + fy[i] * v + phase[i]);
                    *out++ = static_cast<float>(value);
                }
            }
        }
    }
}

uint32_t crc32Of(const void* bytes, size_t size, uint32_t crc) {
    const auto* at = static_cast<const Bytef*>(bytes);
    while (size > 0) {  // zlib's crc32 takes at most 4 GiB at once
        const auto chunk = static_cast<uInt>(std::min<size_t>(size, size_t{1} << 30));
        crc = static_cast<uint32_t>(::crc32(crc, at, chunk));
        at += chunk;
        size -= chunk;
    }
    return crc;
}

std::string crcText(uint32_t crc) {
    char text[9];
    std::snprintf(text, sizeof text, "%08x", crc);
    return text;
}

std::string SyntheticImages::fingerprint() const {
    return name() + ", generator seed " + std::to_string(m_options.seed);
}

std::string SyntheticImages::name() const {
    return "synthetic " + std::to_string(m_options.channels) + "x" + std::to_string(m_options.height) + "x" +
           std::to_string(m_options.width) + ", " + std::to_string(m_options.classes) + " classes, " +
           std::to_string(m_options.samples) + " samples";
}

std::vector<int64_t> SyntheticImages::sampleShape() const {
    return {m_options.channels, m_options.height, m_options.width};
}

int64_t SyntheticImages::label(int64_t index) const {
    uint64_t state = m_options.seed ^ (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ULL);
    return static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(m_options.classes));
}

Batch SyntheticImages::get(const std::vector<int64_t>& indices) const {
    const auto n = static_cast<int64_t>(indices.size());
    const int64_t per = m_prototypes[0].numel();
    Batch batch{torch::empty({n, m_options.channels, m_options.height, m_options.width}, torch::kFloat32),
                torch::empty({n}, torch::kInt64)};
    float* inputs = batch.inputs.data_ptr<float>();
    int64_t* targets = batch.targets.data_ptr<int64_t>();
    const float* prototypes = m_prototypes.data_ptr<float>();
    // Uniform noise with unit variance: as informative as Gaussian noise here, and cheaper.
    const float scale = kNoise * 2.0F * std::sqrt(3.0F);
    for (int64_t i = 0; i < n; ++i) {
        const int64_t index = indices[static_cast<size_t>(i)];
        const int64_t cls = label(index);
        targets[i] = cls;
        uint64_t state = (m_options.seed + 1) * 0x9E3779B97F4A7C15ULL ^ static_cast<uint64_t>(index);
        const float* prototype = prototypes + cls * per;
        float* sample = inputs + i * per;
        for (int64_t j = 0; j < per; ++j) {
            const auto noise = static_cast<float>(unit(state)) - 0.5F;
            sample[j] = prototype[j] + scale * noise;
        }
    }
    return batch;
}

tl::expected<std::shared_ptr<Dataset>, std::string> makeDataset(const DataOptions& options) {
    using Made = tl::expected<std::shared_ptr<Dataset>, std::string>;
    const auto widen = [](auto loaded) -> Made {
        if (!loaded) return tl::unexpected(loaded.error());
        return std::shared_ptr<Dataset>(*loaded);
    };
    if (options.name == "synthetic") {
        // Checked before anything is allocated: one prototype image per class, in host memory.
        const double bytes = static_cast<double>(options.classes) * static_cast<double>(options.channels) *
                             static_cast<double>(options.height) * static_cast<double>(options.width) *
                             static_cast<double>(sizeof(float));
        if (bytes > static_cast<double>(kMaxSyntheticPrototypeBytes)) {
            return tl::unexpected("synthetic data of " + std::to_string(options.classes) + " classes at " +
                                  std::to_string(options.channels) + "x" + std::to_string(options.height) + "x" +
                                  std::to_string(options.width) + " keeps one prototype image per class: " +
                                  formatBytes(static_cast<int64_t>(std::min(bytes, 9e18))) +
                                  " of host memory, more than the " + formatBytes(kMaxSyntheticPrototypeBytes) +
                                  " it may take; use fewer classes (--classes) or a smaller --image-size");
        }
        return std::make_shared<SyntheticImages>(options);
    }
    const bool known = options.name == "mnist" || options.name == "image-folder" || options.name == "csv";
    if (known && options.path.empty()) {
        return tl::unexpected("dataset \"" + options.name + "\" needs a path: give --data-path (the " +
                              (options.name == "csv" ? "CSV file" : "folder") + " to read)");
    }
    if (options.name == "mnist") return widen(MnistDataset::load(options.path));
    if (options.name == "image-folder") return widen(ImageFolderDataset::load(options));
    if (options.name == "csv") {
        return widen(CsvDataset::load(options.path, options.targetColumn, options.regression));
    }
    return tl::unexpected("unknown dataset \"" + options.name + "\": choose " + choiceList(datasetNames()));
}

}  // namespace batchpilot::core
