#include "core/image_folder_dataset.h"

#include <algorithm>
#include <set>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#pragma GCC diagnostic pop

#include "core/cancel.h"

namespace batchpilot::core {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxSide = 4096;
/// Largest image decoded (8192 x 8192): bounds what one file can make BatchPilot allocate.
constexpr int64_t kMaxDecodedPixels = int64_t{1} << 26;
constexpr size_t kListed = 20;  // unreadable files named in the warning; the rest are counted

bool isImageName(const fs::path& path) {
    std::string ext = path.extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    for (const char* known : {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tga", ".pgm", ".ppm", ".pnm"}) {
        if (ext == known) return true;
    }
    return false;
}

bool isHidden(const fs::path& path) { return path.filename().string().rfind('.', 0) == 0; }

struct Candidate {
    std::string file;
    int64_t label = 0;
};

}  // namespace

tl::expected<void, std::string> decodeImage(const std::string& path, int64_t channels, int64_t height, int64_t width,
                                            uint8_t* out) {
    int w = 0, h = 0, present = 0;
    // The size in the header first: a few bytes may claim gigapixels, and stb_image would allocate
    // them before finding out the data is not there.
    if (stbi_info(path.c_str(), &w, &h, &present) != 0 && int64_t{w} * h > kMaxDecodedPixels) {
        return tl::unexpected("its header says " + std::to_string(w) + "x" + std::to_string(h) + " pixels, more than the " +
                              std::to_string(kMaxDecodedPixels) + " BatchPilot decodes in one image");
    }
    stbi_uc* pixels = stbi_load(path.c_str(), &w, &h, &present, static_cast<int>(channels));
    if (pixels == nullptr) {
        const char* reason = stbi_failure_reason();
        return tl::unexpected(std::string(reason != nullptr ? reason : "cannot decode"));
    }
    std::unique_ptr<stbi_uc, void (*)(void*)> owner(pixels, stbi_image_free);
    const uint8_t* interleaved = pixels;
    std::vector<uint8_t> resized;
    if (w != width || h != height) {
        resized.resize(static_cast<size_t>(channels * height * width));
        if (stbir_resize_uint8(pixels, w, h, /*input_stride_in_bytes=*/0, resized.data(), static_cast<int>(width),
                               static_cast<int>(height), /*output_stride_in_bytes=*/0, static_cast<int>(channels)) == 0) {
            return tl::unexpected("cannot resize " + std::to_string(w) + "x" + std::to_string(h) + " to " +
                                  std::to_string(width) + "x" + std::to_string(height));
        }
        interleaved = resized.data();
    }
    // stb gives height x width x channels; the models want channels first.
    const int64_t plane = height * width;
    for (int64_t c = 0; c < channels; ++c) {
        for (int64_t p = 0; p < plane; ++p) out[c * plane + p] = interleaved[p * channels + c];
    }
    return {};
}

tl::expected<std::shared_ptr<ImageFolderDataset>, std::string> ImageFolderDataset::load(const DataOptions& options) {
    const std::string& root = options.path;
    if (options.channels != 1 && options.channels != 3) {
        return tl::unexpected("image-folder data has 1 (grey) or 3 (RGB) channels, not " +
                              std::to_string(options.channels) + ": use an image size such as 3x64x64");
    }
    if (options.height < 1 || options.width < 1 || options.height > kMaxSide || options.width > kMaxSide) {
        return tl::unexpected("image-folder size " + std::to_string(options.height) + "x" + std::to_string(options.width) +
                              " is out of range: each side must be 1 to " + std::to_string(kMaxSide) + " pixels");
    }
    std::error_code ec;
    if (!fs::exists(root, ec)) return tl::unexpected("image folder " + root + " does not exist");
    if (!fs::is_directory(root, ec)) {
        return tl::unexpected(root + " is not a folder: image-folder data is a folder with one subfolder per class");
    }

    std::vector<std::string> classDirs;
    int64_t looseImages = 0;
    for (fs::directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end; !ec && it != end;
         it.increment(ec)) {
        if (isHidden(it->path())) continue;
        if (it->is_directory(ec)) {
            classDirs.push_back(it->path().filename().string());
        } else if (isImageName(it->path())) {
            ++looseImages;
        }
    }
    if (ec) return tl::unexpected("cannot list image folder " + root + ": " + ec.message());
    if (classDirs.empty()) {
        return tl::unexpected("image folder " + root + " has no class subfolders" +
                              (looseImages > 0 ? " (it holds " + std::to_string(looseImages) + " images directly)" : "") +
                              ": put the images of each class in their own subfolder, e.g. " + root + "/cat/1.png");
    }
    if (classDirs.size() == 1) {
        return tl::unexpected("image folder " + root + " has one class subfolder (\"" + classDirs.front() +
                              "\"): a classifier needs at least two classes, each in its own subfolder of " + root +
                              " (root/<class>/<image>)");
    }
    std::sort(classDirs.begin(), classDirs.end());

    std::vector<Candidate> candidates;
    std::vector<std::string> otherFiles;
    // Symbolic links to folders are followed, but every folder and file is taken once: a link
    // back up the tree (a loop) or a second way to the same image would repeat samples, and an
    // image reached from two class folders would get two labels.
    std::set<std::string> seenFiles;
    std::vector<std::string> loops;
    size_t repeatedFiles = 0;
    for (size_t label = 0; label < classDirs.size(); ++label) {
        std::vector<std::string> files;
        const fs::path dir = fs::path(root) / classDirs[label];
        std::set<std::string> seenDirs{fs::weakly_canonical(dir, ec).string()};
        const auto walkOptions = fs::directory_options::follow_directory_symlink | fs::directory_options::skip_permission_denied;
        for (fs::recursive_directory_iterator it(dir, walkOptions, ec), end; !ec && it != end; it.increment(ec)) {
            if (cancelled(cancelFlag())) return tl::unexpected(std::string(kLoadingCancelled));
            if (isHidden(it->path())) {
                if (it->is_directory(ec)) it.disable_recursion_pending();
                continue;
            }
            if (it->is_directory(ec)) {
                std::error_code canonicalError;
                const std::string real = fs::canonical(it->path(), canonicalError).string();
                if (canonicalError || !seenDirs.insert(real).second ||
                    fs::weakly_canonical(dir, canonicalError).string().starts_with(real + "/")) {
                    it.disable_recursion_pending();
                    loops.push_back(it->path().string());
                }
                continue;
            }
            if (!it->is_regular_file(ec)) continue;
            std::error_code canonicalError;
            const std::string real = fs::canonical(it->path(), canonicalError).string();
            if (!canonicalError && !seenFiles.insert(real).second) {
                ++repeatedFiles;
                continue;
            }
            if (isImageName(it->path())) {
                files.push_back(it->path().string());
            } else {
                otherFiles.push_back(it->path().string());
            }
        }
        if (ec) return tl::unexpected("cannot list class folder " + dir.string() + ": " + ec.message());
        std::sort(files.begin(), files.end());
        for (auto& file : files) candidates.push_back({std::move(file), static_cast<int64_t>(label)});
    }
    if (candidates.empty()) {
        return tl::unexpected("image folder " + root + " has " + std::to_string(classDirs.size()) +
                              " class subfolder(s) but no image files in them (PNG, JPEG, BMP, GIF, TGA, PGM/PPM)");
    }

    auto dataset = std::shared_ptr<ImageFolderDataset>(new ImageFolderDataset());
    if (!loops.empty()) {
        dataset->m_warnings.push_back(std::to_string(loops.size()) + " linked folder(s) lead back to a folder already read "
                                      "and were skipped (e.g. " + loops.front() + "): each image is used once");
    }
    if (repeatedFiles > 0) {
        dataset->m_warnings.push_back(std::to_string(repeatedFiles) + " file(s) were reached a second time through a "
                                      "symbolic link and were used only once");
    }
    dataset->m_root = root;
    dataset->m_channels = options.channels;
    dataset->m_height = options.height;
    dataset->m_width = options.width;
    dataset->m_classNames = classDirs;

    // Decode everything once: that finds the unreadable files now rather than mid-training, and
    // fills the cache when the decoded set fits the budget.
    const auto count = static_cast<int64_t>(candidates.size());
    const int64_t perImage = options.channels * options.height * options.width;
    const bool cache = count * perImage <= options.imageCacheBytes;
    torch::Tensor decoded =
        cache ? torch::empty({count, options.channels, options.height, options.width}, torch::kUInt8) : torch::Tensor();
    std::vector<std::string> errors(static_cast<size_t>(count));
    const std::atomic<bool>* stop = cancelFlag();
    at::parallel_for(0, count, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
        std::vector<uint8_t> scratch(cache ? 0 : static_cast<size_t>(perImage));
        for (int64_t i = begin; i < end && !cancelled(stop); ++i) {
            uint8_t* out = cache ? decoded.data_ptr<uint8_t>() + i * perImage : scratch.data();
            const auto ok = decodeImage(candidates[static_cast<size_t>(i)].file, options.channels, options.height,
                                        options.width, out);
            if (!ok) errors[static_cast<size_t>(i)] = ok.error();
        }
    });

    if (cancelled(stop)) return tl::unexpected(std::string(kLoadingCancelled));
    std::vector<std::string> skipped;
    std::vector<int64_t> perClass(classDirs.size(), 0);
    for (int64_t i = 0; i < count; ++i) {
        const Candidate& candidate = candidates[static_cast<size_t>(i)];
        if (!errors[static_cast<size_t>(i)].empty()) {
            skipped.push_back(candidate.file + " (" + errors[static_cast<size_t>(i)] + ")");
            continue;
        }
        if (cache) {
            // Compact in place: the kept image moves to an earlier (or the same) slot.
            const auto kept = static_cast<int64_t>(dataset->m_files.size());
            if (kept != i) {
                uint8_t* base = decoded.data_ptr<uint8_t>();
                std::memmove(base + kept * perImage, base + i * perImage, static_cast<size_t>(perImage));
            }
        }
        dataset->m_files.push_back(candidate.file);
        dataset->m_labels.push_back(candidate.label);
        ++perClass[static_cast<size_t>(candidate.label)];
    }
    if (dataset->m_files.empty()) {
        return tl::unexpected("none of the " + std::to_string(count) + " image files in " + root +
                              " could be decoded; the first: " + skipped.front());
    }
    if (cache) dataset->m_cache = decoded.narrow(/*dim=*/0, /*start=*/0, static_cast<int64_t>(dataset->m_files.size())).clone();

    if (!skipped.empty()) {
        std::string text = std::to_string(skipped.size()) + " of " + std::to_string(count) + " image files in " + root +
                           " could not be read and were skipped: ";
        for (size_t i = 0; i < std::min(skipped.size(), kListed); ++i) text += (i ? "; " : "") + skipped[i];
        if (skipped.size() > kListed) text += "; and " + std::to_string(skipped.size() - kListed) + " more";
        dataset->m_warnings.push_back(text);
    }
    for (size_t label = 0; label < classDirs.size(); ++label) {
        if (perClass[label] == 0) {
            dataset->m_warnings.push_back("class folder \"" + classDirs[label] + "\" (class " + std::to_string(label) +
                                          ") has no readable images; it still counts as a class");
        }
    }
    if (!otherFiles.empty()) {
        dataset->m_warnings.push_back(std::to_string(otherFiles.size()) + " file(s) in " + root +
                                      " are not images by their extension and were ignored, e.g. " + otherFiles.front() +
                                      " (readable: .png .jpg .jpeg .bmp .gif .tga .pgm .ppm .pnm)");
    }
    return dataset;
}

std::string ImageFolderDataset::name() const {
    return "image folder " + fs::path(m_root).filename().string() + ": " + std::to_string(size()) + " images, " +
           std::to_string(classes()) + " classes, " + std::to_string(m_channels) + "x" + std::to_string(m_height) + "x" +
           std::to_string(m_width);
}

Batch ImageFolderDataset::get(const std::vector<int64_t>& indices) const {
    const auto n = static_cast<int64_t>(indices.size());
    const int64_t perImage = m_channels * m_height * m_width;
    torch::Tensor bytes;
    if (m_cache.defined()) {
        bytes = m_cache.index_select(/*dim=*/0, torch::tensor(indices, torch::kInt64));
    } else {
        bytes = torch::empty({n, m_channels, m_height, m_width}, torch::kUInt8);
        for (int64_t i = 0; i < n; ++i) {
            const int64_t index = indices[static_cast<size_t>(i)];
            if (index < 0 || index >= size()) {
                throw std::out_of_range("image index " + std::to_string(index) + " is outside 0.." + std::to_string(size() - 1));
            }
            const std::string& file = m_files[static_cast<size_t>(index)];
            const auto ok = decodeImage(file, m_channels, m_height, m_width, bytes.data_ptr<uint8_t>() + i * perImage);
            if (!ok) {
                throw std::runtime_error("image " + file + " could not be read any more (" + ok.error() +
                                         "); it was readable when the data was loaded: was it changed or removed?");
            }
        }
    }
    auto targets = torch::empty({n}, torch::kInt64);
    int64_t* labels = targets.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) labels[i] = m_labels.at(static_cast<size_t>(indices[static_cast<size_t>(i)]));
    torch::Tensor mean, deviation;
    if (m_channels == 3) {
        mean = torch::tensor({kMean[0], kMean[1], kMean[2]}).view({1, 3, 1, 1});
        deviation = torch::tensor({kStd[0], kStd[1], kStd[2]}).view({1, 3, 1, 1});
    } else {
        mean = torch::full({1, 1, 1, 1}, (kMean[0] + kMean[1] + kMean[2]) / 3.0F);
        deviation = torch::full({1, 1, 1, 1}, (kStd[0] + kStd[1] + kStd[2]) / 3.0F);
    }
    auto inputs = bytes.to(torch::kFloat32).div_(255.0).sub_(mean).div_(deviation);
    return Batch{inputs, targets};
}

}  // namespace batchpilot::core
