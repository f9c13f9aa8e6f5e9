#include "core/data/image_folder_dataset.h"

#include <algorithm>
#include <functional>
#include <set>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <fstream>
#include <stdexcept>
#include <string_view>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#pragma GCC diagnostic pop
#include <png.h>
#include <turbojpeg.h>

#include "core/base/byte_size.h"
#include "core/base/cancel.h"
#include "core/data/dataset.h"

namespace batchpilot::core {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxImageFolderSide = 4096;
/// Largest image decoded (8192 x 8192): bounds what one file can make BatchPilot allocate.
constexpr int64_t kMaxDecodedPixels = int64_t{1} << 26;
/// Largest image file read: those pixels uncompressed at 16 bits and 4 channels (a PNG stored
/// without compression, a 16-bit PPM), plus room for headers and chunks.
constexpr int64_t kLargestImageFileBytes = kMaxDecodedPixels * 4 * 2 + (int64_t{1} << 20);
constexpr size_t kListed = 20;  // unreadable files named in the warning; the rest are counted

bool isImageName(const fs::path& path) {
    std::string ext = path.extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    for (const char* known : {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tga", ".pgm", ".ppm", ".pnm"}) {
        if (ext == known) return true;
    }
    return false;
}

bool isHidden(const fs::path& path) {
    return path.filename().string().rfind('.', 0) == 0;
}

struct Candidate {
    std::string file;
    int64_t label = 0;
};

/// Decoded pixels, interleaved: height x width x channels bytes.
struct Pixels {
    std::vector<uint8_t> bytes;
    int width = 0;
    int height = 0;
};

/// Why an image of w x h pixels is not decoded (a side below 1, or more than kMaxDecodedPixels,
/// each side checked before the product so that it cannot overflow); empty when it is fine.
std::string sizeProblem(int64_t w, int64_t h) {
    if (w < 1 || h < 1) return "the image is " + std::to_string(w) + "x" + std::to_string(h) + " pixels";
    if (w > kMaxDecodedPixels || h > kMaxDecodedPixels || w * h > kMaxDecodedPixels) {
        return "its header says " + std::to_string(w) + "x" + std::to_string(h) + " pixels, more than the " +
               std::to_string(kMaxDecodedPixels) + " BatchPilot decodes in one image";
    }
    return {};
}

/// RGB (3 channels) or grey (1: 77 R + 150 G + 29 B over 256, stb_image's weights, so every format
/// turns grey alike) from `rgb`, which holds `stride` bytes per pixel with R, G, B first.
Pixels fromRgb(const uint8_t* rgb, int w, int h, int stride, int64_t channels) {
    Pixels out{std::vector<uint8_t>(static_cast<size_t>(int64_t{w} * h * channels)), w, h};
    const int64_t count = int64_t{w} * h;
    for (int64_t p = 0; p < count; ++p) {
        const uint8_t* in = rgb + p * stride;
        if (channels == 3) {
            std::memcpy(&out.bytes[static_cast<size_t>(p * 3)], in, 3);
        } else {
            out.bytes[static_cast<size_t>(p)] = static_cast<uint8_t>((in[0] * 77 + in[1] * 150 + in[2] * 29) >> 8);
        }
    }
    return out;
}

/// PNG with libpng's simplified API: the size is checked before the pixels are allocated; a
/// truncated or damaged file is an error, never a partial image.
tl::expected<Pixels, std::string> decodePng(const std::string& file, int64_t channels) {
    png_image image;
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    if (png_image_begin_read_from_memory(&image, file.data(), file.size()) == 0) {
        return tl::unexpected("PNG: " + std::string(image.message));
    }
    struct Release {
        png_image& image;
        ~Release() { png_image_free(&image); }
    } release{image};
    if (const std::string problem = sizeProblem(image.width, image.height); !problem.empty())
        return tl::unexpected(problem);
    image.format = PNG_FORMAT_RGBA;  // alpha is dropped below, as stb_image did
    std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(image));
    if (png_image_finish_read(&image, /*background=*/nullptr, rgba.data(), /*row_stride=*/0, /*colormap=*/nullptr) ==
        0) {
        return tl::unexpected("PNG: " + std::string(image.message));
    }
    return fromRgb(rgba.data(), static_cast<int>(image.width), static_cast<int>(image.height), 4, channels);
}

/// JPEG with libjpeg-turbo: the size is checked before the pixels are allocated, and a warning
/// (a truncated or damaged file) stops decoding: an error, never a partly grey image.
tl::expected<Pixels, std::string> decodeJpeg(const std::string& file, int64_t channels) {
    tjhandle handle = tjInitDecompress();
    if (handle == nullptr) return tl::unexpected(std::string("JPEG: cannot start the decoder"));
    struct Release {
        tjhandle handle;
        ~Release() { tjDestroy(handle); }
    } release{handle};
    const auto* data = reinterpret_cast<const unsigned char*>(file.data());
    int w = 0, h = 0, subsampling = 0, colourspace = 0;
    if (tjDecompressHeader3(handle, data, file.size(), &w, &h, &subsampling, &colourspace) != 0) {
        return tl::unexpected("JPEG: " + std::string(tjGetErrorStr2(handle)));
    }
    if (const std::string problem = sizeProblem(w, h); !problem.empty()) return tl::unexpected(problem);
    std::vector<uint8_t> rgb(static_cast<size_t>(int64_t{w} * h * 3));
    if (tjDecompress2(handle, data, file.size(), rgb.data(), w, /*pitch=*/0, h, TJPF_RGB, TJFLAG_STOPONWARNING) != 0) {
        return tl::unexpected("JPEG: " + std::string(tjGetErrorStr2(handle)));
    }
    return fromRgb(rgb.data(), w, h, 3, channels);
}

/// Binary PGM (P5, grey) and PPM (P6, RGB), 8 or 16 bits per sample, read here: stb_image 2.27
/// overflows its buffer on a short 16-bit PPM (found by fuzz/fuzz_image_folder). Header: the
/// magic, width, height and maximum value as decimals separated by whitespace ('#' comments to
/// the end of a line), one whitespace byte, then the samples (big-endian when the maximum > 255).
tl::expected<Pixels, std::string> decodePnm(const std::string& file, int64_t channels) {
    const int samplesPerPixel = file[1] == '6' ? 3 : 1;
    size_t pos = 2;
    const auto number = [&]() -> int64_t {
        while (pos < file.size()) {
            if (file[pos] == '#') {
                while (pos < file.size() && file[pos] != '\n') ++pos;
            } else if (std::isspace(static_cast<unsigned char>(file[pos])) != 0) {
                ++pos;
            } else {
                break;
            }
        }
        int64_t value = 0;
        int digits = 0;
        while (pos < file.size() && std::isdigit(static_cast<unsigned char>(file[pos])) != 0 && digits < 10) {
            value = value * 10 + (file[pos++] - '0');
            ++digits;
        }
        return digits == 0 ? -1 : value;
    };
    const int64_t w = number(), h = number(), maximum = number();
    if (w < 1 || h < 1 || maximum < 1 || maximum > 65535 || pos >= file.size() ||
        std::isspace(static_cast<unsigned char>(file[pos])) == 0) {
        return tl::unexpected(
            std::string("PNM: the header is not \"P5|P6 width height maximum\" with positive numbers"));
    }
    // sizeProblem checks each side first: two 10-digit sides would overflow their product (found by fuzzing).
    if (const std::string problem = sizeProblem(w, h); !problem.empty()) return tl::unexpected(problem);
    ++pos;
    const int bytesPerSample = maximum > 255 ? 2 : 1;
    const int64_t needed = w * h * samplesPerPixel * bytesPerSample;
    if (static_cast<int64_t>(file.size() - pos) < needed) {
        return tl::unexpected("PNM: the file holds " + std::to_string(file.size() - pos) +
                              " bytes of pixels, its header needs " + std::to_string(needed));
    }
    const auto* raster = reinterpret_cast<const unsigned char*>(file.data()) + pos;
    std::vector<uint8_t> rgb(static_cast<size_t>(w * h * 3));
    for (int64_t p = 0; p < w * h; ++p) {
        for (int c = 0; c < 3; ++c) {
            const int64_t sample = p * samplesPerPixel + (samplesPerPixel == 3 ? c : 0);
            const int64_t value =
                bytesPerSample == 1 ? raster[sample] : (raster[2 * sample] << 8) | raster[2 * sample + 1];
            rgb[static_cast<size_t>(p * 3 + c)] =
                static_cast<uint8_t>((std::min(value, maximum) * 255 + maximum / 2) / maximum);
        }
    }
    return fromRgb(rgb.data(), static_cast<int>(w), static_cast<int>(h), 3, channels);
}

/// BMP, GIF (first frame) and TGA with stb_image, whose own checks let a zero side and giant
/// sizes through: both are checked here first.
tl::expected<Pixels, std::string> decodeWithStb(const std::string& file, int64_t channels) {
    const auto* data = reinterpret_cast<const stbi_uc*>(file.data());
    const int size = static_cast<int>(file.size());
    int w = 0, h = 0, present = 0;
    if (stbi_info_from_memory(data, size, &w, &h, &present) != 0) {
        if (const std::string problem = sizeProblem(w, h); !problem.empty()) return tl::unexpected(problem);
        // stb_image fills what a truncated file lacks with zeros, so a 27-byte TGA could make it
        // decode (and us resize) 64 megapixels. No BMP, GIF or TGA packs more than 4096 pixels in
        // a byte (GIF's LZW at best ~2730, RLE 128): a claim beyond that is not in the file.
        if (int64_t{w} * h > int64_t{4096} * size) {
            return tl::unexpected("its header says " + std::to_string(w) + "x" + std::to_string(h) +
                                  " pixels, more than a file of " + std::to_string(size) + " bytes can hold");
        }
    }
    stbi_uc* pixels = stbi_load_from_memory(data, size, &w, &h, &present, static_cast<int>(channels));
    if (pixels == nullptr) {
        // stb_image may fail without a reason (a GIF without a frame leaves it empty).
        const char* reason = stbi_failure_reason();
        return tl::unexpected(std::string(reason != nullptr && *reason != '\0' ? reason : "cannot decode the image"));
    }
    std::unique_ptr<stbi_uc, void (*)(void*)> owner(pixels, stbi_image_free);
    if (const std::string problem = sizeProblem(w, h); !problem.empty()) return tl::unexpected(problem);
    Pixels out{std::vector<uint8_t>(pixels, pixels + int64_t{w} * h * channels), w, h};
    return out;
}

}  // namespace

tl::expected<void, std::string> decodeImage(const std::string& path, int64_t channels, int64_t height, int64_t width,
                                            uint8_t* out) {
    // The whole file, read once into a buffer of its size: memory follows what the file holds,
    // and a file larger than any image decoded here is refused by its size before it is read (a
    // sparse 2.5 GB "x.png" took 5.3 GB and 21 s before it was refused).
    std::string bytes;
    {
        std::error_code error;
        const uintmax_t size = std::filesystem::file_size(path, error);
        if (error) return tl::unexpected("cannot read the file: " + error.message());
        if (size > static_cast<uintmax_t>(kLargestImageFileBytes)) {
            return tl::unexpected("the file holds " + formatBytes(static_cast<int64_t>(size)) +
                                  ", more than any image read here (at most 2^26 pixels, 16 bits and 4 channels "
                                  "uncompressed: " +
                                  formatBytes(kLargestImageFileBytes) + ")");
        }
        std::ifstream in(path, std::ios::binary);
        if (!in) return tl::unexpected(std::string("cannot open the file"));
        bytes.resize(static_cast<size_t>(size));
        in.read(bytes.data(), static_cast<std::streamsize>(size));
        bytes.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
        if (in.bad()) return tl::unexpected(std::string("cannot read the file"));
    }
    // PNG and JPEG, nearly every image folder, go to libpng and libjpeg-turbo, PGM/PPM to the
    // reader above: fuzzing found stb_image 2.27 (Debian's) writing past its Huffman tables on a
    // crafted JPEG and past its buffer on a short 16-bit PPM.
    const auto starts = [&](std::string_view magic) { return bytes.compare(0, magic.size(), magic) == 0; };
    tl::expected<Pixels, std::string> decoded = starts("\x89PNG\r\n\x1a\n")    ? decodePng(bytes, channels)
                                                : starts("\xff\xd8\xff")       ? decodeJpeg(bytes, channels)
                                                : starts("P5") || starts("P6") ? decodePnm(bytes, channels)
                                                                               : decodeWithStb(bytes, channels);
    if (!decoded) return tl::unexpected(decoded.error());
    const int w = decoded->width, h = decoded->height;
    const uint8_t* pixels = decoded->bytes.data();
    const uint8_t* interleaved = pixels;
    std::vector<uint8_t> resized;
    if (w != width || h != height) {
        resized.resize(static_cast<size_t>(channels * height * width));
        if (stbir_resize_uint8(pixels, w, h, /*input_stride_in_bytes=*/0, resized.data(), static_cast<int>(width),
                               static_cast<int>(height), /*output_stride_in_bytes=*/0,
                               static_cast<int>(channels)) == 0) {
            return tl::unexpected("cannot resize " + std::to_string(w) + "x" + std::to_string(h) + " to " +
                                  std::to_string(width) + "x" + std::to_string(height));
        }
        interleaved = resized.data();
    }
    // Decoded as height x width x channels; the models want channels first.
    const int64_t plane = height * width;
    for (int64_t c = 0; c < channels; ++c) {
        for (int64_t p = 0; p < plane; ++p) out[c * plane + p] = interleaved[p * channels + c];
    }
    return {};
}

namespace {

/// Why `options` cannot describe image-folder data (empty: they can).
std::string optionsProblem(const DataOptions& options) {
    if (options.channels != 1 && options.channels != 3) {
        return "image-folder data has 1 (grey) or 3 (RGB) channels, not " + std::to_string(options.channels) +
               ": use an image size such as 3x64x64";
    }
    if (options.height < 1 || options.width < 1 || options.height > kMaxImageFolderSide ||
        options.width > kMaxImageFolderSide) {
        return "image-folder size " + std::to_string(options.height) + "x" + std::to_string(options.width) +
               " is out of range: each side must be 1 to " + std::to_string(kMaxImageFolderSide) + " pixels";
    }
    return {};
}

/// What a walk of the folder found: the image files by class, and what it passed over.
struct Listing {
    std::vector<std::string> classes;     ///< the class subfolders' names, sorted: label i is classes[i]
    std::vector<Candidate> images;        ///< by class, then by path
    std::vector<std::string> otherFiles;  ///< files whose extension is not an image's
    std::vector<std::string> outside;     ///< symbolic links that lead outside the folder, not followed
    std::vector<std::string> loops;       ///< linked folders that lead back to one already read
    size_t repeatedFiles = 0;             ///< files reached a second time through a link
};

/// The class subfolders of `root`, sorted. Everything read stays inside the folder given: a
/// symbolic link out of it (a class folder linked to "/", say) would walk the whole file system
/// and train on whatever it found; such links go to `listing.outside`.
tl::expected<void, std::string> listClasses(const std::string& root,
                                            const std::function<bool(const fs::path&)>& leadsOutside,
                                            Listing& listing) {
    std::error_code ec;
    int64_t looseImages = 0;
    for (fs::directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end; !ec && it != end;
         it.increment(ec)) {
        if (isHidden(it->path())) continue;
        if (it->is_directory(ec)) {
            if (std::error_code linkError; it->is_symlink(linkError) && leadsOutside(it->path())) {
                listing.outside.push_back(it->path().string());
                continue;
            }
            listing.classes.push_back(it->path().filename().string());
        } else if (isImageName(it->path())) {
            ++looseImages;
        }
    }
    if (ec) return tl::unexpected("cannot list image folder " + root + ": " + ec.message());
    const std::string linkedOut = listing.outside.empty() ? std::string()
                                                          : " (besides " + std::to_string(listing.outside.size()) +
                                                                " linked folder(s) that lead outside it, e.g. " +
                                                                listing.outside.front() + ", which are not followed)";
    if (listing.classes.empty()) {
        return tl::unexpected(
            "image folder " + root + " has no class subfolders" + linkedOut +
            (looseImages > 0 ? " (it holds " + std::to_string(looseImages) + " images directly)" : "") +
            ": put the images of each class in their own subfolder, e.g. " + root + "/cat/1.png");
    }
    if (listing.classes.size() == 1) {
        return tl::unexpected("image folder " + root + " has one class subfolder (\"" + listing.classes.front() +
                              "\")" + linkedOut +
                              ": a classifier needs at least two classes, each in its own subfolder of " + root +
                              " (root/<class>/<image>)");
    }
    std::sort(listing.classes.begin(), listing.classes.end());
    return {};
}

/// The image files of class `label`, at any depth of its folder. Symbolic links to folders are
/// followed, but every folder and file is taken once (`seenFiles` across the classes): a link back
/// up the tree (a loop) or a second way to the same image would repeat samples, and an image
/// reached from two class folders would get two labels.
tl::expected<void, std::string> listClassImages(const std::string& root, size_t label,
                                                const std::function<bool(const fs::path&)>& leadsOutside,
                                                std::set<std::string>& seenFiles, Listing& listing) {
    std::error_code ec;
    std::vector<std::string> files;
    const fs::path dir = fs::path(root) / listing.classes[label];
    std::set<std::string> seenDirs{fs::weakly_canonical(dir, ec).string()};
    const auto walkOptions =
        fs::directory_options::follow_directory_symlink | fs::directory_options::skip_permission_denied;
    for (fs::recursive_directory_iterator it(dir, walkOptions, ec), end; !ec && it != end; it.increment(ec)) {
        if (cancelled(cancelFlag())) return tl::unexpected(std::string(kLoadingCancelled));
        if (isHidden(it->path())) {
            if (it->is_directory(ec)) it.disable_recursion_pending();
            continue;
        }
        // Its own error code: the iterator's would end the listing on a dangling link.
        if (std::error_code linkError; it->is_symlink(linkError) && leadsOutside(it->path())) {
            it.disable_recursion_pending();
            listing.outside.push_back(it->path().string());
            continue;
        }
        if (it->is_directory(ec)) {
            std::error_code canonicalError;
            const std::string real = fs::canonical(it->path(), canonicalError).string();
            if (canonicalError || !seenDirs.insert(real).second ||
                fs::weakly_canonical(dir, canonicalError).string().starts_with(real + "/")) {
                it.disable_recursion_pending();
                listing.loops.push_back(it->path().string());
            }
            continue;
        }
        if (!it->is_regular_file(ec)) continue;
        std::error_code canonicalError;
        const std::string real = fs::canonical(it->path(), canonicalError).string();
        if (!canonicalError && !seenFiles.insert(real).second) {
            ++listing.repeatedFiles;
            continue;
        }
        (isImageName(it->path()) ? files : listing.otherFiles).push_back(it->path().string());
    }
    if (ec) return tl::unexpected("cannot list class folder " + dir.string() + ": " + ec.message());
    std::sort(files.begin(), files.end());
    for (auto& file : files) listing.images.push_back({std::move(file), static_cast<int64_t>(label)});
    return {};
}

/// Walks `root`: its class subfolders and their images.
tl::expected<Listing, std::string> listImageFolder(const std::string& root) {
    std::error_code ec;
    if (!fs::exists(root, ec)) return tl::unexpected("image folder " + root + " does not exist");
    if (!fs::is_directory(root, ec)) {
        return tl::unexpected(root + " is not a folder: image-folder data is a folder with one subfolder per class");
    }
    const std::string inside = fs::canonical(root, ec).string();
    if (ec) return tl::unexpected("cannot open image folder " + root + ": " + ec.message());
    // A dangling link leads nowhere, not outside: it is passed over as before.
    const std::function<bool(const fs::path&)> leadsOutside = [&inside](const fs::path& path) {
        std::error_code canonicalError;
        const std::string real = fs::canonical(path, canonicalError).string();
        return !canonicalError && real != inside && !real.starts_with(inside + "/");
    };
    Listing listing;
    if (auto listed = listClasses(root, leadsOutside, listing); !listed) return tl::unexpected(listed.error());
    std::set<std::string> seenFiles;
    for (size_t label = 0; label < listing.classes.size(); ++label) {
        if (auto listed = listClassImages(root, label, leadsOutside, seenFiles, listing); !listed)
            return tl::unexpected(listed.error());
    }
    if (listing.images.empty()) {
        return tl::unexpected("image folder " + root + " has " + std::to_string(listing.classes.size()) +
                              " class subfolder(s) but no image files in them (PNG, JPEG, BMP, GIF, TGA, PGM/PPM)");
    }
    return listing;
}

/// What the walk passed over, as warnings.
std::vector<std::string> listingWarnings(const Listing& listing, const std::string& root) {
    std::vector<std::string> warnings;
    if (!listing.outside.empty()) {
        warnings.push_back(std::to_string(listing.outside.size()) + " symbolic link(s) lead outside " + root +
                           " and were skipped (e.g. " + listing.outside.front() +
                           "): a data set's images are read from inside its folder; copy them in, or give the "
                           "folder they are in");
    }
    if (!listing.loops.empty()) {
        warnings.push_back(std::to_string(listing.loops.size()) +
                           " linked folder(s) lead back to a folder already read and were skipped (e.g. " +
                           listing.loops.front() + "): each image is used once");
    }
    if (listing.repeatedFiles > 0) {
        warnings.push_back(std::to_string(listing.repeatedFiles) +
                           " file(s) were reached a second time through a symbolic link and were used only once");
    }
    return warnings;
}

/// Every image decoded, each on LibTorch's threads: the unreadable ones are found now rather than
/// mid-training. `cache`, when defined, receives each image (count x channels x height x width);
/// else each is decoded into scratch memory and dropped. Returns each image's error (empty: read).
std::vector<std::string> decodeAll(const std::vector<Candidate>& images, const DataOptions& options,
                                   torch::Tensor& cache) {
    const auto count = static_cast<int64_t>(images.size());
    const int64_t perImage = options.channels * options.height * options.width;
    std::vector<std::string> errors(static_cast<size_t>(count));
    const std::atomic<bool>* stop = cancelFlag();
    at::parallel_for(0, count, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
        std::vector<uint8_t> scratch(cache.defined() ? 0 : static_cast<size_t>(perImage));
        for (int64_t i = begin; i < end && !cancelled(stop); ++i) {
            uint8_t* out = cache.defined() ? cache.data_ptr<uint8_t>() + i * perImage : scratch.data();
            const auto ok =
                decodeImage(images[static_cast<size_t>(i)].file, options.channels, options.height, options.width, out);
            if (!ok) errors[static_cast<size_t>(i)] = ok.error();
        }
    });
    return errors;
}

/// "N of M image files in ROOT could not be read and were skipped: …", the first kListed named.
std::string skippedWarning(const std::vector<std::string>& skipped, int64_t count, const std::string& root) {
    std::string text = std::to_string(skipped.size()) + " of " + std::to_string(count) + " image files in " + root +
                       " could not be read and were skipped: ";
    for (size_t i = 0; i < std::min(skipped.size(), kListed); ++i) text += (i ? "; " : "") + skipped[i];
    if (skipped.size() > kListed) text += "; and " + std::to_string(skipped.size() - kListed) + " more";
    return text;
}

/// Each kept image's path inside the folder and its size: another folder, another set of images
/// or an image replaced by one of another size gives another fingerprint, without reading every
/// file again.
std::string listingFingerprint(const std::vector<std::string>& files, const std::string& root,
                               const DataOptions& options) {
    uint32_t crc = 0;
    for (const std::string& file : files) {
        std::error_code ec;
        const std::string relative = fs::path(file).lexically_relative(root).string();
        const auto bytes = static_cast<uint64_t>(fs::file_size(file, ec));
        crc = crc32Of(relative.data(), relative.size() + 1, crc);  // with its terminating zero
        crc = crc32Of(&bytes, sizeof bytes, crc);
    }
    return "image folder " + fs::path(root).filename().string() + ", " + std::to_string(files.size()) +
           " images, listing CRC-32 " + crcText(crc) + ", " + std::to_string(options.channels) + "x" +
           std::to_string(options.height) + "x" + std::to_string(options.width);
}

}  // namespace

tl::expected<std::shared_ptr<ImageFolderDataset>, std::string> ImageFolderDataset::load(const DataOptions& options) {
    const std::string& root = options.path;
    if (const std::string problem = optionsProblem(options); !problem.empty()) return tl::unexpected(problem);
    auto listing = listImageFolder(root);
    if (!listing) return tl::unexpected(listing.error());

    auto dataset = std::shared_ptr<ImageFolderDataset>(new ImageFolderDataset());
    dataset->m_warnings = listingWarnings(*listing, root);
    dataset->m_root = root;
    dataset->m_channels = options.channels;
    dataset->m_height = options.height;
    dataset->m_width = options.width;
    dataset->m_classNames = listing->classes;

    // Decoded once, into the cache when the decoded set fits its budget.
    const auto count = static_cast<int64_t>(listing->images.size());
    const int64_t perImage = options.channels * options.height * options.width;
    torch::Tensor decoded = count * perImage <= options.imageCacheBytes
                                ? torch::empty({count, options.channels, options.height, options.width}, torch::kUInt8)
                                : torch::Tensor();
    const std::vector<std::string> errors = decodeAll(listing->images, options, decoded);
    if (cancelled(cancelFlag())) return tl::unexpected(std::string(kLoadingCancelled));
    std::vector<std::string> skipped;
    std::vector<int64_t> perClass(listing->classes.size(), 0);
    for (int64_t i = 0; i < count; ++i) {
        const Candidate& image = listing->images[static_cast<size_t>(i)];
        if (!errors[static_cast<size_t>(i)].empty()) {
            skipped.push_back(image.file + " (" + errors[static_cast<size_t>(i)] + ")");
            continue;
        }
        // Compact the cache in place: the kept image moves to an earlier (or the same) slot.
        if (const auto kept = static_cast<int64_t>(dataset->m_files.size()); decoded.defined() && kept != i) {
            uint8_t* base = decoded.data_ptr<uint8_t>();
            std::memmove(base + kept * perImage, base + i * perImage, static_cast<size_t>(perImage));
        }
        dataset->m_files.push_back(image.file);
        dataset->m_labels.push_back(image.label);
        ++perClass[static_cast<size_t>(image.label)];
    }
    if (dataset->m_files.empty()) {
        return tl::unexpected("none of the " + std::to_string(count) + " image files in " + root +
                              " could be decoded; the first: " + skipped.front());
    }
    if (decoded.defined())
        dataset->m_cache =
            decoded.narrow(/*dim=*/0, /*start=*/0, static_cast<int64_t>(dataset->m_files.size())).clone();

    if (!skipped.empty()) dataset->m_warnings.push_back(skippedWarning(skipped, count, root));
    for (size_t label = 0; label < listing->classes.size(); ++label) {
        if (perClass[label] == 0) {
            dataset->m_warnings.push_back("class folder \"" + listing->classes[label] + "\" (class " +
                                          std::to_string(label) +
                                          ") has no readable images; it still counts as a class");
        }
    }
    if (!listing->otherFiles.empty()) {
        dataset->m_warnings.push_back(std::to_string(listing->otherFiles.size()) + " file(s) in " + root +
                                      " are not images by their extension and were ignored, e.g. " +
                                      listing->otherFiles.front() +
                                      " (readable: .png .jpg .jpeg .bmp .gif .tga .pgm .ppm .pnm)");
    }
    dataset->m_fingerprint = listingFingerprint(dataset->m_files, root, options);
    return dataset;
}

std::string ImageFolderDataset::name() const {
    return "image folder " + fs::path(m_root).filename().string() + ": " + std::to_string(size()) + " images, " +
           std::to_string(classes()) + " classes, " + std::to_string(m_channels) + "x" + std::to_string(m_height) +
           "x" + std::to_string(m_width);
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
                throw std::out_of_range("image index " + std::to_string(index) + " is outside 0.." +
                                        std::to_string(size() - 1));
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
