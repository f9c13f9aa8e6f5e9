#include "core/data/mnist_dataset.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <zlib.h>

#include "core/base/cancel.h"
#include "core/data/dataset.h"

namespace batchpilot::core {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr uint32_t kMaxMnistSide = 4096;

uint32_t bigEndian32(const uint8_t* bytes) {
    return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) | uint32_t{bytes[3]};
}

std::string hex(uint32_t value) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%08X", value);
    return text;
}

/// `base` or `base.gz`, whichever exists (the plain file first).
std::optional<std::string> findEither(const fs::path& base) {
    std::error_code ec;
    if (fs::is_regular_file(base, ec)) return base.string();
    fs::path gz = base;
    gz += ".gz";
    if (fs::is_regular_file(gz, ec)) return gz.string();
    return std::nullopt;
}

struct Pair {
    std::string images;
    std::string labels;
};

tl::expected<Pair, std::string> locate(const std::string& path) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        const auto images = findEither(fs::path(path) / "train-images-idx3-ubyte");
        const auto labels = findEither(fs::path(path) / "train-labels-idx1-ubyte");
        if (!images || !labels) {
            return tl::unexpected("MNIST folder " + path + " has no " +
                                  (images ? "train-labels-idx1-ubyte" : "train-images-idx3-ubyte") +
                                  " (plain or .gz): put both IDX files there, or give the path of an "
                                  "images file such as t10k-images-idx3-ubyte");
        }
        return Pair{*images, *labels};
    }
    if (!fs::exists(path, ec)) {
        return tl::unexpected("MNIST data " + path +
                              " does not exist: give the folder holding "
                              "train-images-idx3-ubyte and train-labels-idx1-ubyte (plain or .gz)");
    }
    const std::string file = fs::path(path).filename().string();
    const auto at = file.find("images-idx3-ubyte");
    if (at == std::string::npos) {
        return tl::unexpected("MNIST data " + path +
                              " is neither a folder nor an images file named "
                              "<prefix>images-idx3-ubyte[.gz]: give the folder holding the IDX files");
    }
    std::string labelsName = file;
    labelsName.replace(at, std::string("images-idx3-ubyte").size(), "labels-idx1-ubyte");
    if (labelsName.size() > 3 && labelsName.ends_with(".gz")) labelsName.resize(labelsName.size() - 3);
    const auto labels = findEither(fs::path(path).parent_path() / labelsName);
    if (!labels) {
        return tl::unexpected("MNIST labels " + (fs::path(path).parent_path() / labelsName).string() +
                              "[.gz] for the images " + path + " do not exist: put the labels file next to the images");
    }
    return Pair{path, *labels};
}

}  // namespace

tl::expected<std::vector<uint8_t>, std::string> readMaybeGzipped(const std::string& path, uint64_t maxBytes) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
        return tl::unexpected("file " + path + " does not exist or is not a regular file");
    // gzread reads plain files unchanged ("transparent" mode), so one path serves both.
    gzFile file = gzopen(path.c_str(), "rb");
    if (file == nullptr) return tl::unexpected("cannot open " + path + " for reading: check its permissions");
    gzbuffer(file, 1 << 17);
    std::vector<uint8_t> bytes;
    constexpr unsigned kChunk = 1U << 20;
    // Memory grows with what the file holds, never past maxBytes + 1 (one byte more tells the
    // caller that there was more): never with what a header claims.
    const std::atomic<bool>* stop = cancelFlag();
    for (;;) {
        if (cancelled(stop)) {
            gzclose(file);
            return tl::unexpected(std::string(kLoadingCancelled));
        }
        const size_t used = bytes.size();
        if (used > maxBytes) break;
        const auto chunk = static_cast<unsigned>(std::min<uint64_t>(kChunk - 1, maxBytes - used) + 1);
        bytes.resize(used + chunk);
        const int got = gzread(file, bytes.data() + used, chunk);
        if (got < 0) break;
        bytes.resize(used + static_cast<size_t>(got));
        if (got == 0) break;
    }
    int code = Z_OK;
    const char* message = gzerror(file, &code);
    std::string error = code != Z_OK ? std::string(message ? message : "read error") : std::string();
    const int closed = gzclose_r(file);
    if (error.empty() && closed != Z_OK) error = closed == Z_BUF_ERROR ? "unexpected end of file" : "read error";
    if (!error.empty()) {
        return tl::unexpected("cannot read " + path + ": " + error +
                              " (a truncated or corrupt gzip file? download or decompress it again)");
    }
    return bytes;
}

MnistDataset::MnistDataset(std::string imagesPath, torch::Tensor images, torch::Tensor labels, int64_t classes)
    : m_imagesPath(std::move(imagesPath)),
      m_images(std::move(images)),
      m_labels(std::move(labels)),
      m_classes(classes) {}

tl::expected<std::shared_ptr<MnistDataset>, std::string> MnistDataset::load(const std::string& path) {
    const auto pair = locate(path);
    if (!pair) return tl::unexpected(pair.error());
    // The headers first (16 and 8 bytes): the rest is read only up to the size they declare.
    auto images = readMaybeGzipped(pair->images, 16);
    if (!images) return tl::unexpected(images.error());
    auto labels = readMaybeGzipped(pair->labels, 8);
    if (!labels) return tl::unexpected(labels.error());

    const auto corrupt = [](const std::string& file, const std::string& what) {
        return tl::unexpected("MNIST file " + file + " " + what + ": it is not a valid IDX file; download it again");
    };
    // The magic number first: a swapped or foreign file is named as such, whatever its length.
    const uint32_t imagesMagic = images->size() >= 4 ? bigEndian32(images->data()) : 0;
    if (images->size() >= 4 && imagesMagic != kImagesMagic) {
        return corrupt(pair->images, "starts with " + hex(imagesMagic) + ", not the images magic number " +
                                         hex(kImagesMagic) +
                                         (imagesMagic == kLabelsMagic ? " (it is a labels file)" : ""));
    }
    const uint32_t labelsMagic = labels->size() >= 4 ? bigEndian32(labels->data()) : 0;
    if (labels->size() >= 4 && labelsMagic != kLabelsMagic) {
        return corrupt(pair->labels, "starts with " + hex(labelsMagic) + ", not the labels magic number " +
                                         hex(kLabelsMagic) +
                                         (labelsMagic == kImagesMagic ? " (it is an images file)" : ""));
    }
    if (images->size() < 16) {
        return corrupt(pair->images,
                       "is " + std::to_string(images->size()) + " bytes, shorter than the 16-byte IDX header");
    }
    if (labels->size() < 8) {
        return corrupt(pair->labels,
                       "is " + std::to_string(labels->size()) + " bytes, shorter than the 8-byte IDX header");
    }
    const uint64_t count = bigEndian32(images->data() + 4);
    const uint32_t rows = bigEndian32(images->data() + 8);
    const uint32_t cols = bigEndian32(images->data() + 12);
    const uint64_t labelCount = bigEndian32(labels->data() + 4);
    if (rows == 0 || cols == 0 || rows > kMaxMnistSide || cols > kMaxMnistSide) {
        return corrupt(pair->images, "declares images of " + std::to_string(rows) + "x" + std::to_string(cols) +
                                         " pixels (expected 1 to " + std::to_string(kMaxMnistSide) + " per side)");
    }
    if (count == 0) return corrupt(pair->images, "declares 0 images");
    const uint64_t expectedImages = 16 + count * rows * cols;
    images = readMaybeGzipped(pair->images, expectedImages);
    if (!images) return tl::unexpected(images.error());
    labels = readMaybeGzipped(pair->labels, 8 + labelCount);
    if (!labels) return tl::unexpected(labels.error());
    if (images->size() > expectedImages) {
        return corrupt(pair->images, "holds more than the " + std::to_string(expectedImages) +
                                         " bytes its header declares (" + std::to_string(count) + " images of " +
                                         std::to_string(rows) + "x" + std::to_string(cols) + ")");
    }
    if (labels->size() > 8 + labelCount) {
        return corrupt(pair->labels, "holds more than the " + std::to_string(8 + labelCount) +
                                         " bytes its header declares (" + std::to_string(labelCount) + " labels)");
    }
    if (images->size() != expectedImages) {
        return corrupt(pair->images, "is " + std::to_string(images->size()) + " bytes, but its header declares " +
                                         std::to_string(count) + " images of " + std::to_string(rows) + "x" +
                                         std::to_string(cols) + " = " + std::to_string(expectedImages) + " bytes" +
                                         (images->size() < expectedImages ? " (truncated)" : ""));
    }
    if (labels->size() != 8 + labelCount) {
        return corrupt(pair->labels, "is " + std::to_string(labels->size()) + " bytes, but its header declares " +
                                         std::to_string(labelCount) + " labels = " + std::to_string(8 + labelCount) +
                                         " bytes" + (labels->size() < 8 + labelCount ? " (truncated)" : ""));
    }
    if (labelCount != count) {
        return tl::unexpected("MNIST files do not match: " + pair->images + " has " + std::to_string(count) +
                              " images but " + pair->labels + " has " + std::to_string(labelCount) +
                              " labels; use the images and labels of the same split");
    }

    const auto n = static_cast<int64_t>(count);
    auto imageTensor = torch::empty({n, int64_t{rows}, int64_t{cols}}, torch::kUInt8);
    std::copy(images->begin() + 16, images->end(), imageTensor.data_ptr<uint8_t>());
    auto labelTensor = torch::empty({n}, torch::kInt64);
    int64_t* out = labelTensor.data_ptr<int64_t>();
    uint8_t largest = 0;
    for (int64_t i = 0; i < n; ++i) {
        const uint8_t label = (*labels)[8 + static_cast<size_t>(i)];
        out[i] = label;
        largest = std::max(largest, label);
    }
    const int64_t classes = std::max<int64_t>(2, int64_t{largest} + 1);
    auto dataset = std::shared_ptr<MnistDataset>(
        new MnistDataset(pair->images, std::move(imageTensor), std::move(labelTensor), classes));
    const uint32_t crc = crc32Of(labels->data(), labels->size(), crc32Of(images->data(), images->size()));
    dataset->m_fingerprint = "MNIST " + fs::path(pair->images).filename().string() + ", content CRC-32 " + crcText(crc);
    return dataset;
}

std::string MnistDataset::name() const {
    return "MNIST " + fs::path(m_imagesPath).filename().string() + ": " + std::to_string(size()) + " images " +
           std::to_string(m_images.size(1)) + "x" + std::to_string(m_images.size(2)) + ", " +
           std::to_string(m_classes) + " classes";
}

Batch MnistDataset::get(const std::vector<int64_t>& indices) const {
    const auto index = torch::tensor(indices, torch::kInt64);
    auto inputs = m_images.index_select(/*dim=*/0, index).to(torch::kFloat32);
    inputs.div_(255.0).sub_(kMean).div_(kStd);
    return Batch{inputs.unsqueeze(/*dim=*/1), m_labels.index_select(/*dim=*/0, index)};
}

}  // namespace batchpilot::core
