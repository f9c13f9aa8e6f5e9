#include <QtTest>
#include "tests/test_main.h"

#include <fstream>
#include <thread>

#include <torch/torch.h>
#include <zlib.h>

#include "core/data/dataset.h"
#include "core/data/mnist_dataset.h"

namespace tst_mnist_dataset {

using namespace batchpilot::core;

namespace {

void put32(std::vector<uint8_t>& out, uint32_t value) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(value >> shift));
}

/// An IDX images file: `count` images of rows x cols whose pixel (i, r, c) is (7i + 3r + c) % 256.
std::vector<uint8_t> idxImages(uint32_t count, uint32_t rows, uint32_t cols, uint32_t magic = 0x803) {
    std::vector<uint8_t> out;
    put32(out, magic);
    put32(out, count);
    put32(out, rows);
    put32(out, cols);
    for (uint32_t i = 0; i < count; ++i) {
        for (uint32_t r = 0; r < rows; ++r) {
            for (uint32_t c = 0; c < cols; ++c) out.push_back(static_cast<uint8_t>((7 * i + 3 * r + c) % 256));
        }
    }
    return out;
}

std::vector<uint8_t> idxLabels(const std::vector<uint8_t>& labels, uint32_t magic = 0x801) {
    std::vector<uint8_t> out;
    put32(out, magic);
    put32(out, static_cast<uint32_t>(labels.size()));
    out.insert(out.end(), labels.begin(), labels.end());
    return out;
}

void writePlain(const QString& path, const std::vector<uint8_t>& bytes) {
    std::ofstream out(path.toStdString(), std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    QVERIFY(out.good());
}

void writeGzip(const QString& path, const std::vector<uint8_t>& bytes) {
    gzFile file = gzopen(path.toLocal8Bit().constData(), "wb");
    QVERIFY(file != nullptr);
    QCOMPARE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    QCOMPARE(gzclose(file), Z_OK);
}

std::vector<uint8_t> readAll(const QString& path) {
    std::ifstream in(path.toStdString(), std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const std::vector<uint8_t> kLabels = {3, 0, 7, 1, 9, 2};

float normalised(int pixel) {
    return static_cast<float>((pixel / 255.0 - MnistDataset::kMean) / MnistDataset::kStd);
}

}  // namespace

class TestMnistDataset : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void decodesPlainAndGzipped_data() {
        QTest::addColumn<bool>("gzipped");
        QTest::newRow("plain") << false;
        QTest::newRow("gzip") << true;
    }
    void decodesPlainAndGzipped() {
        QFETCH(bool, gzipped);
        QTemporaryDir dir;
        const QString suffix = gzipped ? QStringLiteral(".gz") : QString();
        auto write = gzipped ? writeGzip : writePlain;
        write(dir.filePath(QStringLiteral("train-images-idx3-ubyte") + suffix), idxImages(6, 28, 28));
        write(dir.filePath(QStringLiteral("train-labels-idx1-ubyte") + suffix), idxLabels(kLabels));

        DataOptions options;
        options.name = "mnist";
        options.path = dir.path().toStdString();
        auto made = makeDataset(options);
        QVERIFY2(made, made ? "" : made.error().c_str());
        const Dataset& data = **made;
        QCOMPARE(data.size(), int64_t{6});
        QCOMPARE(data.sampleShape(), (std::vector<int64_t>{1, 28, 28}));
        QCOMPARE(data.classes(), int64_t{10});
        QVERIFY(QString::fromStdString(data.name()).contains(QStringLiteral("6 images 28x28")));

        const Batch batch = data.get({4, 0, 4});
        QCOMPARE(batch.inputs.sizes().vec(), (std::vector<int64_t>{3, 1, 28, 28}));
        QCOMPARE(batch.inputs.dtype(), torch::kFloat32);
        QCOMPARE(batch.targets.dtype(), torch::kInt64);
        QCOMPARE(batch.targets[0].item<int64_t>(), int64_t{9});
        QCOMPARE(batch.targets[1].item<int64_t>(), int64_t{3});
        for (const auto& [r, c] : {std::pair{0, 0}, std::pair{5, 11}, std::pair{27, 27}}) {
            QCOMPARE(batch.inputs[0][0][r][c].item<float>(), normalised((7 * 4 + 3 * r + c) % 256));
            QCOMPARE(batch.inputs[1][0][r][c].item<float>(), normalised((3 * r + c) % 256));
        }
        QVERIFY(torch::equal(batch.inputs[0], batch.inputs[2]));
    }

    void imagesFileNamesItsSplit() {
        QTemporaryDir dir;
        writeGzip(dir.filePath(QStringLiteral("t10k-images-idx3-ubyte.gz")), idxImages(2, 4, 5));
        writePlain(dir.filePath(QStringLiteral("t10k-labels-idx1-ubyte")), idxLabels({1, 0}));
        auto data = MnistDataset::load(dir.filePath(QStringLiteral("t10k-images-idx3-ubyte.gz")).toStdString());
        QVERIFY2(data, data ? "" : data.error().c_str());
        QCOMPARE((*data)->sampleShape(), (std::vector<int64_t>{1, 4, 5}));
        QCOMPARE((*data)->classes(), int64_t{2});
        QCOMPARE((*data)->get({0}).targets[0].item<int64_t>(), int64_t{1});
    }

    /// A gzip stream that holds far more than its header declares (a "zip bomb": 10 images of
    /// 28x28, then 256 MiB of zeros) is refused after reading one byte past the declared size,
    /// never decompressed whole.
    void gzipHoldingMoreThanDeclaredStopsEarly() {
        QTemporaryDir dir;
        const QString images = dir.filePath(QStringLiteral("train-images-idx3-ubyte.gz"));
        gzFile file = gzopen(images.toLocal8Bit().constData(), "wb9");
        QVERIFY(file != nullptr);
        const auto header = idxImages(10, 28, 28);
        QCOMPARE(gzwrite(file, header.data(), static_cast<unsigned>(header.size())), static_cast<int>(header.size()));
        const std::vector<uint8_t> zeros(1 << 20, 0);
        for (int i = 0; i < 256; ++i)
            QCOMPARE(gzwrite(file, zeros.data(), static_cast<unsigned>(zeros.size())), 1 << 20);
        QCOMPARE(gzclose(file), Z_OK);
        writePlain(dir.filePath(QStringLiteral("train-labels-idx1-ubyte")), idxLabels({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
        // What the reader may hold is bounded by the declared size, whatever the stream holds.
        const auto capped = readMaybeGzipped(images.toStdString(), 16 + 10 * 28 * 28);
        QVERIFY(capped);
        QCOMPARE(capped->size(), size_t(16 + 10 * 28 * 28 + 1));
        const auto data = MnistDataset::load(dir.path().toStdString());
        QVERIFY(!data);
        QVERIFY2(QString::fromStdString(data.error())
                     .contains(QStringLiteral("holds more than the 7856 bytes its header declares")),
                 data.error().c_str());
    }

    void concurrentGetsAgree() {
        QTemporaryDir dir;
        writePlain(dir.filePath(QStringLiteral("train-images-idx3-ubyte")), idxImages(6, 28, 28));
        writePlain(dir.filePath(QStringLiteral("train-labels-idx1-ubyte")), idxLabels(kLabels));
        auto data = MnistDataset::load(dir.path().toStdString());
        QVERIFY(data);
        const Batch expected = (*data)->get({5, 1, 2});
        std::vector<std::thread> threads;
        std::atomic<int> mismatches = 0;
        for (int t = 0; t < 4; ++t) {
            threads.emplace_back([&] {
                for (int i = 0; i < 50; ++i) {
                    const Batch b = (*data)->get({5, 1, 2});
                    if (!torch::equal(b.inputs, expected.inputs) || !torch::equal(b.targets, expected.targets))
                        ++mismatches;
                }
            });
        }
        for (auto& thread : threads) thread.join();
        QCOMPARE(mismatches.load(), 0);
    }

    void corruptFilesAreClearErrors_data() {
        QTest::addColumn<QString>("kind");
        QTest::addColumn<QString>("file");
        QTest::addColumn<QString>("message");
        QTest::newRow("no folder") << QStringLiteral("missing") << QStringLiteral("nowhere")
                                   << QStringLiteral("does not exist");
        QTest::newRow("no labels") << QStringLiteral("no-labels") << QStringLiteral("")
                                   << QStringLiteral("has no train-labels-idx1-ubyte");
        QTest::newRow("bad magic") << QStringLiteral("bad-magic") << QStringLiteral("train-images-idx3-ubyte")
                                   << QStringLiteral("starts with 0x12345678, not the images magic number 0x00000803");
        QTest::newRow("swapped") << QStringLiteral("swapped") << QStringLiteral("train-images-idx3-ubyte")
                                 << QStringLiteral("(it is a labels file)");
        QTest::newRow("truncated images")
            << QStringLiteral("truncated") << QStringLiteral("train-images-idx3-ubyte")
            << QStringLiteral("header declares 6 images of 28x28 = 4720 bytes (truncated)");
        QTest::newRow("extra bytes") << QStringLiteral("extra") << QStringLiteral("train-labels-idx1-ubyte")
                                     << QStringLiteral("holds more than the 14 bytes its header declares (6 labels)");
        QTest::newRow("short header") << QStringLiteral("short") << QStringLiteral("train-images-idx3-ubyte")
                                      << QStringLiteral("shorter than the 16-byte IDX header");
        QTest::newRow("truncated gzip") << QStringLiteral("truncated-gz")
                                        << QStringLiteral("train-images-idx3-ubyte.gz")
                                        << QStringLiteral("truncated or corrupt gzip");
        QTest::newRow("count mismatch") << QStringLiteral("mismatch") << QStringLiteral("train-labels-idx1-ubyte")
                                        << QStringLiteral("has 6 images but");
        QTest::newRow("zero size") << QStringLiteral("zero-rows") << QStringLiteral("train-images-idx3-ubyte")
                                   << QStringLiteral("declares images of 0x28 pixels");
    }
    void corruptFilesAreClearErrors() {
        QFETCH(QString, kind);
        QFETCH(QString, file);
        QFETCH(QString, message);
        QTemporaryDir dir;
        const QString images = dir.filePath(QStringLiteral("train-images-idx3-ubyte"));
        const QString labels = dir.filePath(QStringLiteral("train-labels-idx1-ubyte"));
        auto goodImages = idxImages(6, 28, 28);
        auto goodLabels = idxLabels(kLabels);
        std::string path = dir.path().toStdString();
        if (kind == QLatin1String("missing")) {
            path = dir.filePath(QStringLiteral("nowhere")).toStdString();
        } else if (kind == QLatin1String("no-labels")) {
            writePlain(images, goodImages);
        } else if (kind == QLatin1String("bad-magic")) {
            auto bytes = goodImages;
            bytes[0] = 0x12, bytes[1] = 0x34, bytes[2] = 0x56, bytes[3] = 0x78;
            writePlain(images, bytes);
            writePlain(labels, goodLabels);
        } else if (kind == QLatin1String("swapped")) {
            writePlain(images, goodLabels);
            writePlain(labels, goodLabels);
        } else if (kind == QLatin1String("truncated")) {
            goodImages.resize(goodImages.size() - 100);
            writePlain(images, goodImages);
            writePlain(labels, goodLabels);
        } else if (kind == QLatin1String("extra")) {
            goodLabels.push_back(1);
            writePlain(images, goodImages);
            writePlain(labels, goodLabels);
        } else if (kind == QLatin1String("short")) {
            goodImages.resize(10);
            writePlain(images, goodImages);
            writePlain(labels, goodLabels);
        } else if (kind == QLatin1String("truncated-gz")) {
            writeGzip(images + QStringLiteral(".gz"), goodImages);
            auto compressed = readAll(images + QStringLiteral(".gz"));
            compressed.resize(compressed.size() / 2);
            writePlain(images + QStringLiteral(".gz"), compressed);
            writePlain(labels, goodLabels);
        } else if (kind == QLatin1String("mismatch")) {
            writePlain(images, goodImages);
            writePlain(labels, idxLabels({1, 2, 3}));
        } else if (kind == QLatin1String("zero-rows")) {
            writePlain(images, idxImages(6, 0, 28));
            writePlain(labels, goodLabels);
        }
        auto data = MnistDataset::load(path);
        QVERIFY(!data);
        const QString error = QString::fromStdString(data.error());
        QVERIFY2(error.contains(message), qPrintable(error));
        if (!file.isEmpty()) QVERIFY2(error.contains(file), qPrintable(error));
    }
};

}  // namespace tst_mnist_dataset

BATCHPILOT_TEST_MAIN(tst_mnist_dataset::TestMnistDataset)
#include "tst_mnist_dataset.moc"
