// Issue 13's "done means", run as a user would: one data set of handwritten-style digits in all
// three formats BatchPilot reads (MNIST IDX files, an image folder, a CSV table), trained with
// batchpilot-cli; the validation accuracy it prints must rise during training and end well
// above chance. The data stands in for scikit-learn's 1,797 8x8 digits (not shipped): the same
// size and shape, drawn here from a 5x7 font with random shifts, stroke strength, noise and
// flipped pixels, so that a model has to generalise to held-out samples.

#include <QtTest>

#include <QProcess>
#include <QRegularExpression>
#include <QTemporaryDir>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/core/stb_image_write_impl.h"

namespace fs = std::filesystem;

namespace {

constexpr int kSide = 8;           // 8x8 pixels, as scikit-learn's digits
constexpr int kSamples = 1797;     // as many samples
constexpr int kMaxIntensity = 16;  // pixel values 0..16 in the CSV, as scikit-learn's

// A 5x7 font: '#' is ink.
const std::array<std::array<const char*, 7>, 10> kGlyphs{{
    {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."},
    {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."},
    {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"},
    {"####.", "....#", "....#", ".###.", "....#", "....#", "####."},
    {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."},
    {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."},
    {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."},
    {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."},
    {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."},
    {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."},
}};

struct Digit {
    std::array<uint8_t, kSide * kSide> pixels{};  // 0..16
    uint8_t label = 0;
};

/// The data set: labels in turn, each glyph placed at a random offset with its own ink strength,
/// Gaussian noise and 4% of its pixels flipped. Deterministic.
std::vector<Digit> makeDigits() {
    std::mt19937 random(1797);
    std::uniform_int_distribution<int> dx(0, kSide - 5), dy(0, kSide - 7), ink(9, kMaxIntensity);
    std::normal_distribution<double> noise(0.0, 2.0);
    std::bernoulli_distribution flip(0.04);
    std::vector<Digit> digits(kSamples);
    for (int i = 0; i < kSamples; ++i) {
        Digit& d = digits[static_cast<size_t>(i)];
        d.label = static_cast<uint8_t>(i % 10);
        const int x0 = dx(random), y0 = dy(random), strength = ink(random);
        for (int y = 0; y < kSide; ++y) {
            for (int x = 0; x < kSide; ++x) {
                const int gx = x - x0, gy = y - y0;
                const bool on = gx >= 0 && gx < 5 && gy >= 0 && gy < 7 && kGlyphs[d.label][gy][gx] == '#';
                double value = (on != flip(random) ? strength : 0) + noise(random);
                value = std::clamp(value, 0.0, double(kMaxIntensity));
                d.pixels[static_cast<size_t>(y * kSide + x)] = static_cast<uint8_t>(std::lround(value));
            }
        }
    }
    return digits;
}

uint8_t toByte(uint8_t value) {
    return static_cast<uint8_t>(value * 255 / kMaxIntensity);
}

void writeBigEndian(std::ofstream& out, uint32_t value) {
    const char bytes[4] = {char(value >> 24), char(value >> 16), char(value >> 8), char(value)};
    out.write(bytes, 4);
}

/// MNIST's IDX format: train-images-idx3-ubyte and train-labels-idx1-ubyte in `folder`.
bool writeMnist(const fs::path& folder, const std::vector<Digit>& digits) {
    fs::create_directories(folder);
    std::ofstream images(folder / "train-images-idx3-ubyte", std::ios::binary);
    writeBigEndian(images, 0x803);
    writeBigEndian(images, static_cast<uint32_t>(digits.size()));
    writeBigEndian(images, kSide);
    writeBigEndian(images, kSide);
    for (const Digit& d : digits)
        for (uint8_t p : d.pixels) images.put(static_cast<char>(toByte(p)));
    std::ofstream labels(folder / "train-labels-idx1-ubyte", std::ios::binary);
    writeBigEndian(labels, 0x801);
    writeBigEndian(labels, static_cast<uint32_t>(digits.size()));
    for (const Digit& d : digits) labels.put(static_cast<char>(d.label));
    return images.good() && labels.good();
}

/// An image folder: one grey PNG per sample in a folder per class.
bool writeImageFolder(const fs::path& root, const std::vector<Digit>& digits) {
    for (size_t i = 0; i < digits.size(); ++i) {
        const fs::path folder = root / std::to_string(digits[i].label);
        fs::create_directories(folder);
        std::array<uint8_t, kSide * kSide> grey{};
        for (size_t p = 0; p < grey.size(); ++p) grey[p] = toByte(digits[i].pixels[p]);
        const std::string path = (folder / (std::to_string(i) + ".png")).string();
        if (!stbi_write_png(path.c_str(), kSide, kSide, 1, grey.data(), kSide)) return false;
    }
    return true;
}

/// A CSV table as scikit-learn's digits come: 64 pixel columns (0..16), then the label.
bool writeCsv(const fs::path& path, const std::vector<Digit>& digits) {
    std::ofstream out(path);
    for (int p = 0; p < kSide * kSide; ++p) out << "pixel_" << p / kSide << "_" << p % kSide << ",";
    out << "digit\n";
    for (const Digit& d : digits) {
        for (uint8_t p : d.pixels) out << int(p) << ",";
        out << int(d.label) << "\n";
    }
    return out.good();
}

}  // namespace

class TestDigits : public QObject {
    Q_OBJECT
    QTemporaryDir m_dir;
    std::vector<Digit> m_digits = makeDigits();

private Q_SLOTS:
    void initTestCase() {
        QVERIFY(m_dir.isValid());
        const fs::path root = m_dir.path().toStdString();
        QVERIFY(writeMnist(root / "mnist", m_digits));
        QVERIFY(writeImageFolder(root / "images", m_digits));
        QVERIFY(writeCsv(root / "digits.csv", m_digits));
    }

    void validationAccuracyRises_data() {
        QTest::addColumn<QStringList>("data");
        const QString root = m_dir.path();
        QTest::newRow("MNIST IDX files") << QStringList{QStringLiteral("--data"), QStringLiteral("mnist"),
                                                        QStringLiteral("--data-path"), root + QStringLiteral("/mnist")};
        QTest::newRow("image folder") << QStringList{QStringLiteral("--data"),       QStringLiteral("image-folder"),
                                                     QStringLiteral("--data-path"),  root + QStringLiteral("/images"),
                                                     QStringLiteral("--image-size"), QStringLiteral("1x8x8")};
        QTest::newRow("CSV table") << QStringList{
            QStringLiteral("--data"),          QStringLiteral("csv"),
            QStringLiteral("--data-path"),     root + QStringLiteral("/digits.csv"),
            QStringLiteral("--target-column"), QStringLiteral("digit")};
    }
    /// The default held-out share (10%: 180 of 1,797 samples), validated after each of 4 epochs.
    void validationAccuracyRises() {
        QFETCH(QStringList, data);
        QProcess cli;
        cli.start(QStringLiteral(BATCHPILOT_CLI_PATH),
                  data + QStringList{QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--target-batch"),
                                     QStringLiteral("64"), QStringLiteral("--epochs"), QStringLiteral("4"),
                                     QStringLiteral("--optimizer"), QStringLiteral("adam"), QStringLiteral("--lr"),
                                     QStringLiteral("0.003"), QStringLiteral("--threads"), QStringLiteral("1"),
                                     QStringLiteral("--no-run-folder")});
        QVERIFY(cli.waitForFinished(300000));
        const QString out = QString::fromUtf8(cli.readAllStandardOutput());
        const QString err = QString::fromUtf8(cli.readAllStandardError());
        QVERIFY2(cli.exitStatus() == QProcess::NormalExit && cli.exitCode() == 0, qPrintable(err + out));

        static const QRegularExpression line(QStringLiteral(
            R"(validation after step (\d+): loss [0-9.]+, accuracy ([0-9.]+)%, top-5 [0-9.]+% on (\d+) held-out samples)"));
        std::vector<double> accuracies;
        for (auto it = line.globalMatch(out); it.hasNext();) {
            const QRegularExpressionMatch m = it.next();
            QCOMPARE(m.captured(3).toInt(), 180);
            accuracies.push_back(m.captured(2).toDouble());
        }
        QVERIFY2(accuracies.size() == 4, qPrintable(out));
        // Chance is 10%. The first pass comes after one epoch of 26 steps.
        QVERIFY2(accuracies.back() >= accuracies.front(), qPrintable(out));  // a tie at a plateau is fine
        QVERIFY2(accuracies.back() >= 80.0, qPrintable(out));
        QVERIFY2(out.contains(QStringLiteral("validation: loss")), qPrintable(out));  // the run summary's line
    }
};

QTEST_GUILESS_MAIN(TestDigits)
#include "tst_digits.moc"
