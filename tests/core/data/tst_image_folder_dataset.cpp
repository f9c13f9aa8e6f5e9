#include <QtTest>
#include "tests/test_main.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include <zlib.h>

#include <torch/torch.h>

#include "tests/core/stb_image_write_impl.h"

#include "core/data/dataset.h"
#include "core/data/image_folder_dataset.h"

namespace tst_image_folder_dataset {

using namespace batchpilot::core;

namespace {

namespace fs = std::filesystem;

struct Rgb {
    uint8_t r, g, b;
};

/// A solid-colour RGB image of w x h pixels, written in the format the extension names.
void writeImage(const fs::path& path, int w, int h, Rgb colour) {
    fs::create_directories(path.parent_path());
    std::vector<uint8_t> pixels;
    for (int i = 0; i < w * h; ++i) pixels.insert(pixels.end(), {colour.r, colour.g, colour.b});
    const std::string ext = path.extension().string();
    int ok = 0;
    if (ext == ".png") ok = stbi_write_png(path.c_str(), w, h, 3, pixels.data(), w * 3);
    if (ext == ".bmp") ok = stbi_write_bmp(path.c_str(), w, h, 3, pixels.data());
    if (ext == ".jpg") ok = stbi_write_jpg(path.c_str(), w, h, 3, pixels.data(), /*quality=*/95);
    QVERIFY2(ok != 0, path.c_str());
}

void writeBytes(const fs::path& path, const std::string& bytes) {
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << bytes;
}

float normalised(int value, int channel) {
    return (static_cast<float>(value) / 255.0F - ImageFolderDataset::kMean[static_cast<size_t>(channel)]) /
           ImageFolderDataset::kStd[static_cast<size_t>(channel)];
}

/// Inverts the normalisation of channel `c` of sample `i` at pixel (y, x) back to 0..255.
float pixel(const Batch& batch, int64_t i, int64_t c, int64_t y, int64_t x) {
    const float v = batch.inputs[i][c][y][x].item<float>();
    return (v * ImageFolderDataset::kStd[static_cast<size_t>(c)] + ImageFolderDataset::kMean[static_cast<size_t>(c)]) *
           255.0F;
}

/// root/cat: 2 PNGs (one 4x4, one 9x7 to be resized), a JPEG and a BMP; root/dog: 1 PNG, a broken
/// "PNG", a truncated PNG and a text file; root/.hidden/x.png is not a class.
void writeFolder(const fs::path& root) {
    writeImage(root / "cat" / "a.png", 4, 4, {255, 0, 10});
    writeImage(root / "cat" / "b.png", 9, 7, {0, 200, 0});
    writeImage(root / "cat" / "nested" / "c.jpg", 4, 4, {30, 60, 90});
    writeImage(root / "cat" / "d.bmp", 4, 4, {1, 2, 3});
    writeImage(root / "dog" / "e.png", 4, 4, {100, 100, 100});
    writeBytes(root / "dog" / "broken.png", "this is not a png at all");
    writeImage(root / "dog" / "cut.png", 16, 16, {5, 5, 5});
    const auto cut = root / "dog" / "cut.png";
    fs::resize_file(cut, fs::file_size(cut) / 2);
    writeBytes(root / "dog" / "notes.txt", "hello");
    writeImage(root / ".hidden" / "x.png", 4, 4, {0, 0, 0});
    writeImage(root / "dog" / ".thumb.png", 4, 4, {0, 0, 0});
}

DataOptions folderOptions(const fs::path& root, int64_t channels = 3) {
    DataOptions options;
    options.name = "image-folder";
    options.path = root.string();
    options.channels = channels;
    options.height = 4;
    options.width = 4;
    return options;
}

}  // namespace

class TestImageFolderDataset : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void decodesResizesAndSkipsUnreadable_data() {
        QTest::addColumn<bool>("cached");
        QTest::newRow("cached") << true;
        QTest::newRow("decoded per get") << false;
    }
    void decodesResizesAndSkipsUnreadable() {
        QFETCH(bool, cached);
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        writeFolder(root);
        DataOptions options = folderOptions(root);
        if (!cached) options.imageCacheBytes = 0;
        auto made = makeDataset(options);
        QVERIFY2(made, made ? "" : made.error().c_str());
        const auto& data = dynamic_cast<const ImageFolderDataset&>(**made);
        QCOMPARE(data.cached(), cached);
        QCOMPARE(data.classNames(), (std::vector<std::string>{"cat", "dog"}));
        QCOMPARE(data.classes(), int64_t{2});
        QCOMPARE(data.size(), int64_t{5});
        QCOMPARE(data.sampleShape(), (std::vector<int64_t>{3, 4, 4}));
        std::vector<std::string> names;
        for (const auto& file : data.files()) names.push_back(fs::relative(file, root).string());
        QCOMPARE(names,
                 (std::vector<std::string>{"cat/a.png", "cat/b.png", "cat/d.bmp", "cat/nested/c.jpg", "dog/e.png"}));
        QCOMPARE(data.labels(), (std::vector<int64_t>{0, 0, 0, 0, 1}));

        const auto warnings = data.warnings();
        QCOMPARE(warnings.size(), size_t{2});
        const QString skipped = QString::fromStdString(warnings[0]);
        QVERIFY2(skipped.startsWith(QStringLiteral("2 of 7 image files")), qPrintable(skipped));
        QVERIFY2(skipped.contains(QStringLiteral("broken.png")) && skipped.contains(QStringLiteral("cut.png")),
                 qPrintable(skipped));
        QVERIFY2(QString::fromStdString(warnings[1]).contains(QStringLiteral("notes.txt")), warnings[1].c_str());

        const Batch batch = data.get({0, 1, 2, 3, 4, 0});
        QCOMPARE(batch.inputs.sizes().vec(), (std::vector<int64_t>{6, 3, 4, 4}));
        QVERIFY(torch::equal(batch.targets, torch::tensor({0, 0, 0, 0, 1, 0}, torch::kInt64)));
        // Lossless formats at the target size decode exactly.
        QCOMPARE(batch.inputs[0][0][1][2].item<float>(), normalised(255, 0));
        QCOMPARE(batch.inputs[0][2][3][3].item<float>(), normalised(10, 2));
        QCOMPARE(batch.inputs[2][1][0][0].item<float>(), normalised(2, 1));
        QCOMPARE(batch.inputs[4][1][2][2].item<float>(), normalised(100, 1));
        // A solid image stays solid when resized; JPEG is close.
        for (int64_t y = 0; y < 4; ++y) {
            for (int64_t x = 0; x < 4; ++x) {
                QVERIFY(std::abs(pixel(batch, 1, 1, y, x) - 200.0F) < 1.01F);
                QVERIFY(std::abs(pixel(batch, 1, 0, y, x)) < 1.01F);
                QVERIFY(std::abs(pixel(batch, 3, 2, y, x) - 90.0F) < 4.0F);
            }
        }
        QVERIFY(torch::equal(batch.inputs[0], batch.inputs[5]));
    }

    void greyscale() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        writeImage(root / "0" / "a.png", 4, 4, {90, 90, 90});
        writeImage(root / "1" / "b.bmp", 4, 4, {200, 200, 200});
        auto data = ImageFolderDataset::load(folderOptions(root, /*channels=*/1));
        QVERIFY2(data, data ? "" : data.error().c_str());
        const Batch batch = (*data)->get({1, 0});
        QCOMPARE(batch.inputs.sizes().vec(), (std::vector<int64_t>{2, 1, 4, 4}));
        QVERIFY(batch.inputs[0][0][0][0].item<float>() > batch.inputs[1][0][0][0].item<float>());
        QVERIFY((*data)->warnings().empty());
    }

    /// A link back up the tree (cat/loop -> ..) and a second way to the same images: each image is
    /// one sample with its own label, and a warning says what was skipped.
    void symlinkLoopsAndRepeatsAreReadOnce() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        for (int i = 0; i < 4; ++i) {
            writeImage(root / "cat" / ("c" + std::to_string(i) + ".png"), 4, 4, {200, 0, 0});
            writeImage(root / "dog" / ("d" + std::to_string(i) + ".png"), 4, 4, {0, 0, 200});
        }
        fs::create_directory_symlink("..", root / "cat" / "loop");
        fs::create_directory_symlink(root / "dog", root / "dog" / "again");
        auto data = ImageFolderDataset::load(folderOptions(root));
        QVERIFY2(data, data ? "" : data.error().c_str());
        QCOMPARE((*data)->size(), qint64(8));
        const Batch batch = (*data)->get({0, 1, 2, 3, 4, 5, 6, 7});
        QCOMPARE(batch.targets.sum().item<int64_t>(), qint64(4));  // four cats (0), four dogs (1)
        const auto warnings = (*data)->warnings();
        QVERIFY(!warnings.empty());
        QVERIFY2(
            QString::fromStdString(warnings.front()).contains(QStringLiteral("lead back to a folder already read")),
            warnings.front().c_str());
    }

    void concurrentUncachedGets() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        for (int i = 0; i < 8; ++i) {
            writeImage(root / (i % 2 ? "odd" : "even") / (std::to_string(i) + ".png"), 6, 5,
                       {static_cast<uint8_t>(30 * i), 7, static_cast<uint8_t>(255 - 30 * i)});
        }
        DataOptions options = folderOptions(root);
        options.imageCacheBytes = 0;
        auto data = ImageFolderDataset::load(options);
        QVERIFY(data);
        const std::vector<int64_t> all = {0, 1, 2, 3, 4, 5, 6, 7};
        const Batch expected = (*data)->get(all);
        std::atomic<int> mismatches = 0;
        std::vector<std::thread> threads;
        for (int t = 0; t < 4; ++t) {
            threads.emplace_back([&] {
                for (int i = 0; i < 20; ++i) {
                    if (!torch::equal((*data)->get(all).inputs, expected.inputs)) ++mismatches;
                }
            });
        }
        for (auto& thread : threads) thread.join();
        QCOMPARE(mismatches.load(), 0);
    }

    void badFoldersAreClearErrors_data() {
        QTest::addColumn<QString>("layout");
        QTest::addColumn<QString>("message");
        QTest::newRow("missing") << QStringLiteral("missing") << QStringLiteral("does not exist");
        QTest::newRow("empty") << QStringLiteral("empty") << QStringLiteral("has no class subfolders: put the images");
        QTest::newRow("loose images") << QStringLiteral("loose")
                                      << QStringLiteral("has no class subfolders (it holds 2 images directly)");
        QTest::newRow("a file") << QStringLiteral("file") << QStringLiteral("is not a folder");
        QTest::newRow("no images") << QStringLiteral("no-images")
                                   << QStringLiteral("has 2 class subfolder(s) but no image files");
        QTest::newRow("all broken") << QStringLiteral("broken") << QStringLiteral("none of the 2 image files");
        QTest::newRow("two channels") << QStringLiteral("channels")
                                      << QStringLiteral("1 (grey) or 3 (RGB) channels, not 2");
    }
    void badFoldersAreClearErrors() {
        QFETCH(QString, layout);
        QFETCH(QString, message);
        QTemporaryDir dir;
        fs::path root = fs::path(dir.path().toStdString()) / "images";
        DataOptions options = folderOptions(root);
        if (layout == QLatin1String("empty")) fs::create_directories(root);
        if (layout == QLatin1String("loose")) {
            writeImage(root / "a.png", 4, 4, {1, 1, 1});
            writeImage(root / "b.png", 4, 4, {1, 1, 1});
        }
        if (layout == QLatin1String("file")) writeBytes(root, "x");
        if (layout == QLatin1String("no-images")) {
            writeBytes(root / "a" / "readme.txt", "x");
            fs::create_directories(root / "b");
        }
        if (layout == QLatin1String("broken")) {
            writeBytes(root / "a" / "1.png", "garbage");
            writeBytes(root / "b" / "2.jpg", "garbage");
        }
        if (layout == QLatin1String("channels")) {
            writeImage(root / "a" / "1.png", 4, 4, {1, 1, 1});
            options.channels = 2;
        }
        auto data = ImageFolderDataset::load(options);
        QVERIFY(!data);
        const QString error = QString::fromStdString(data.error());
        QVERIFY2(error.contains(message), qPrintable(error));
        if (layout != QLatin1String("channels"))
            QVERIFY2(error.contains(QString::fromStdString(root.string())), qPrintable(error));
    }

    /// Files found by fuzz/fuzz_image_decode and fuzz/fuzz_image_folder, and a size bomb: each is an
    /// error naming what is wrong, with no crash, no undefined behaviour (the sanitizer build runs
    /// this) and no allocation for pixels the file does not hold.
    void hostileImagesAreRefused_data() {
        QTest::addColumn<QByteArray>("bytes");
        QTest::addColumn<QString>("message");
        // A PGM whose height is 0: stb_image accepted it and the resize divided by zero.
        QTest::newRow("PNM with a zero side")
            << QByteArray("P5\n4\0\0\n255\n\x00\x25JO", 15)
            << QStringLiteral("PNM: the header is not \"P5|P6 width height maximum\" with positive numbers");
        // A JPEG Huffman table declaring 16 x 255 codes: stb_image 2.27 wrote past its tables.
        QTest::newRow("JPEG with 4080 Huffman codes")
            << (QByteArray("\xff\xd8\xff\xc4\x00\x13\x00", 7) + QByteArray(16, '\xff') + QByteArray(64, '\x01'))
            << QStringLiteral("JPEG: ");
        // A 69-byte PNG claiming 100000 x 100000 pixels (40 GB as RGBA).
        QByteArray ihdr("IHDR", 4);
        for (const quint32 side : {100000U, 100000U}) {
            for (int shift = 24; shift >= 0; shift -= 8) ihdr.append(char((side >> shift) & 0xFF));
        }
        ihdr.append(QByteArray("\x08\x02\x00\x00\x00", 5));
        QByteArray png("\x89PNG\r\n\x1a\n\x00\x00\x00\x0d", 12);
        png += ihdr;
        const quint32 crc =
            quint32(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(ihdr.constData()), uInt(ihdr.size())));
        for (int shift = 24; shift >= 0; shift -= 8) png.append(char((crc >> shift) & 0xFF));
        png += QByteArray("\x00\x00\x00\x00IDAT\x35\xaf\x06\x1e", 12);  // no pixel data at all
        png += QByteArray("\x00\x00\x00\x00IEND\xae\x42\x60\x82", 12);
        // A 16-bit PPM holding fewer samples than its header says: stb_image overflowed its buffer.
        QTest::newRow("short 16-bit PPM")
            << QByteArray("P6\n2 2\n256\n\x00\x35j%Z", 16)
            << QStringLiteral("PNM: the file holds 5 bytes of pixels, its header needs 24");
        // A GIF whose image block holds no frame: stb_image failed with an empty reason.
        QTest::newRow("GIF without a frame")
            << QByteArray(
                   "GIF89a\x02\x00\x02\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff,\x00\x00\x00\x00\x02\x00\x02\x00\x00"
                   "B\x02"
                   "D\x01\x00;",
                   35)
            << QStringLiteral("cannot decode the image");
        // A 28-byte TGA claiming 8000 x 8000 pixels: stb_image decoded 64 megapixels of zeros (a
        // fuzzing timeout: time and memory followed the claim, not the file).
        QTest::newRow("TGA claiming more than it holds")
            << (QByteArray("\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40\x1f\x40\x1f\x18\x00", 18) +
                QByteArray(10, '\x7f'))
            << QStringLiteral("its header says 8000x8000 pixels, more than a file of 28 bytes can hold");
        // Found by fuzzing the PPM reader that replaced stb_image's: sides whose product overflows.
        QTest::newRow("PPM with 10-digit sides") << QByteArray("P6\n4444444444 4444444444\n255\n\x00\xff", 31)
                                                 << QStringLiteral("its header says 4444444444x4444444444 pixels");
        QTest::newRow("PNG claiming 10^10 pixels")
            << png << QStringLiteral("its header says 100000x100000 pixels, more than the 67108864");
    }
    void hostileImagesAreRefused() {
        QFETCH(QByteArray, bytes);
        QFETCH(QString, message);
        QTemporaryDir dir;
        const std::string path = dir.filePath(QStringLiteral("image")).toStdString();
        writeBytes(path, bytes.toStdString());
        for (const int64_t channels : {1, 3}) {
            std::vector<uint8_t> out(static_cast<size_t>(channels * 8 * 8));
            const auto decoded = decodeImage(path, channels, 8, 8, out.data());
            QVERIFY(!decoded);
            QVERIFY2(QString::fromStdString(decoded.error()).contains(message), decoded.error().c_str());
        }
    }

    /// PGM/PPM are read by BatchPilot: 8- and 16-bit samples scale to 0..255, comments are skipped.
    void pnmSamplesScaleToBytes() {
        QTemporaryDir dir;
        const std::string path = dir.filePath(QStringLiteral("a.pgm")).toStdString();
        writeBytes(path, std::string("P5\n# a comment\n2 1\n1000\n\x00\x00\x03\xe8", 28));  // 0 and 1000 of 1000
        std::vector<uint8_t> grey(2);
        QVERIFY(decodeImage(path, 1, 1, 2, grey.data()));
        QCOMPARE(grey, (std::vector<uint8_t>{0, 255}));
        writeBytes(path, std::string("P6 1 1 255 \x0a\x14\x1e", 14));  // one RGB pixel (10, 20, 30)
        std::vector<uint8_t> rgb(3);
        QVERIFY(decodeImage(path, 3, 1, 1, rgb.data()));
        QCOMPARE(rgb, (std::vector<uint8_t>{10, 20, 30}));
    }

    void removedFileIsAnErrorNotACrash() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        writeImage(root / "a" / "1.png", 4, 4, {1, 1, 1});
        writeImage(root / "b" / "2.png", 4, 4, {2, 2, 2});
        DataOptions options = folderOptions(root);
        options.imageCacheBytes = 0;
        auto data = ImageFolderDataset::load(options);
        QVERIFY(data);
        fs::remove(root / "b" / "2.png");
        QVERIFY_THROWS_EXCEPTION(std::runtime_error, (*data)->get({1}));
        QCOMPARE((*data)->get({0}).targets[0].item<int64_t>(), int64_t{0});
    }
};

}  // namespace tst_image_folder_dataset

BATCHPILOT_TEST_MAIN(tst_image_folder_dataset::TestImageFolderDataset)
#include "tst_image_folder_dataset.moc"
