#include <QtTest>
#include "tests/test_main.h"

#include <cmath>

#include <fstream>

#include <torch/torch.h>

#include "core/data/csv_dataset.h"
#include "core/data/dataset.h"
#include "core/train/trainer.h"
#include "tests/core/recording_sink.h"

namespace tst_csv_dataset {

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;

namespace {

std::string write(const QTemporaryDir& dir, const char* name, const std::string& text) {
    const std::string path = dir.filePath(QString::fromLatin1(name)).toStdString();
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

}  // namespace

class TestCsvDataset : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void integerClassesAndStandardisedFeatures() {
        QTemporaryDir dir;
        const auto path = write(dir, "data.csv", "a,label,b\n1,0,10\n2,2,10\n3,1,10\n");
        DataOptions options;
        options.name = "csv";
        options.path = path;
        options.targetColumn = "label";
        auto made = makeDataset(options);
        QVERIFY2(made, made ? "" : made.error().c_str());
        const auto& data = dynamic_cast<const CsvDataset&>(**made);
        QCOMPARE(data.size(), int64_t{3});
        QCOMPARE(data.sampleShape(), (std::vector<int64_t>{2}));
        QCOMPARE(data.classes(), int64_t{3});
        QCOMPARE(data.featureNames(), (std::vector<std::string>{"a", "b"}));
        QVERIFY(data.classNames().empty());
        const Batch batch = data.get({2, 0});
        QCOMPARE(batch.targets.dtype(), torch::kInt64);
        QCOMPARE(batch.targets[0].item<int64_t>(), int64_t{1});
        QCOMPARE(batch.targets[1].item<int64_t>(), int64_t{0});
        // a = 1, 2, 3: mean 2, population std sqrt(2/3); b is constant, so 0.
        const float sd = std::sqrt(2.0F / 3.0F);
        QVERIFY(std::abs(batch.inputs[0][0].item<float>() - 1.0F / sd) < 1e-5F);
        QVERIFY(std::abs(batch.inputs[1][0].item<float>() + 1.0F / sd) < 1e-5F);
        QCOMPARE(batch.inputs[0][1].item<float>(), 0.0F);
    }

    void stringLabelsMapToSortedIds() {
        QTemporaryDir dir;
        const auto path = write(dir, "iris.csv",
                                "\xEF\xBB\xBFsepal,petal,species\r\n5.1,1.4,setosa\r\n7.0,4.7,versicolor\r\n"
                                "6.3,6.0,virginica\r\n\r\n4.9,1.5,\"setosa\"\r\n");
        auto data = CsvDataset::load(path, "species", /*regression=*/false);
        QVERIFY2(data, data ? "" : data.error().c_str());
        QCOMPARE((*data)->size(), int64_t{4});
        QCOMPARE((*data)->classes(), int64_t{3});
        QCOMPARE((*data)->classNames(), (std::vector<std::string>{"setosa", "versicolor", "virginica"}));
        const Batch batch = (*data)->get({0, 1, 2, 3});
        QVERIFY(torch::equal(batch.targets, torch::tensor({0, 1, 2, 0}, torch::kInt64)));
        const QString name = QString::fromStdString((*data)->name());
        QVERIFY2(name.contains(QStringLiteral("setosa=0, versicolor=1, virginica=2")), qPrintable(name));
    }

    void signedLabelsMapInNumericOrder() {
        QTemporaryDir dir;
        const auto path = write(dir, "svm.csv", "x,y\n1,1\n2,-1\n3,-10\n4,1\n");
        auto data = CsvDataset::load(path, "y", false);
        QVERIFY2(data, data ? "" : data.error().c_str());
        QCOMPARE((*data)->classNames(), (std::vector<std::string>{"-10", "-1", "1"}));
        QVERIFY(torch::equal((*data)->get({0, 1, 2, 3}).targets, torch::tensor({2, 1, 0, 2}, torch::kInt64)));
    }

    void quotedFields() {
        QTemporaryDir dir;
        const auto path =
            write(dir, "q.csv", "\"x, the first\",\"kind\"\n\" 1.5\",\"a \"\"quoted\"\" b\"\n-2e1,plain\n");
        auto data = CsvDataset::load(path, "kind", false);
        QVERIFY2(data, data ? "" : data.error().c_str());
        QCOMPARE((*data)->featureNames(), (std::vector<std::string>{"x, the first"}));
        QCOMPARE((*data)->classNames(), (std::vector<std::string>{"a \"quoted\" b", "plain"}));
    }

    void regressionTargetsAreFloatColumns() {
        QTemporaryDir dir;
        const auto path = write(dir, "r.csv", "x,y\n1,0.5\n2,-1.25\n3,1e3\n");
        DataOptions options;
        options.name = "csv";
        options.path = path;
        options.targetColumn = "y";
        options.regression = true;
        auto made = makeDataset(options);
        QVERIFY2(made, made ? "" : made.error().c_str());
        QCOMPARE((*made)->classes(), int64_t{1});
        const Batch batch = (*made)->get({1, 2});
        QCOMPARE(batch.targets.dtype(), torch::kFloat32);
        QCOMPARE(batch.targets.sizes().vec(), (std::vector<int64_t>{2, 1}));
        QCOMPARE(batch.targets[0][0].item<float>(), -1.25F);
        QCOMPARE(batch.targets[1][0].item<float>(), 1000.0F);
        QVERIFY(QString::fromStdString((*made)->name()).contains(QStringLiteral("regression")));
    }

    /// Features near the double range standardise like the same column at an ordinary scale
    /// (standardising does not depend on the unit), instead of overflowing to NaN.
    void hugeFeaturesStandardiseLikeSmallOnes() {
        QTemporaryDir dir;
        const auto huge =
            CsvDataset::load(write(dir, "huge.csv", "a,y\n1e308,0\n-1.5e308,1\n0,0\n5e307,1\n"), "y", false);
        QVERIFY2(huge, huge ? "" : huge.error().c_str());
        const auto got = (*huge)->get({0, 1, 2, 3}).inputs.flatten();
        // The column is 1e308 x (1, -1.5, 0, 0.5): mean 0, standard deviation 1e308 x sqrt(0.875).
        const double sd = std::sqrt(0.875);
        const auto expected = torch::tensor({1.0 / sd, -1.5 / sd, 0.0, 0.5 / sd}, torch::kFloat32);
        QVERIFY(torch::isfinite(got).all().item<bool>());
        QVERIFY2(torch::allclose(got, expected, 1e-5, 1e-6), "standardised values differ from mean 0, unit variance");
    }

    void badFilesAreClearErrors_data() {
        QTest::addColumn<QString>("content");
        QTest::addColumn<QString>("target");
        QTest::addColumn<bool>("regression");
        QTest::addColumn<QString>("message");
        QTest::newRow("missing column") << QStringLiteral("a,b,c\n1,2,3\n") << QStringLiteral("label") << false
                                        << QStringLiteral(
                                               "has no column \"label\"; the columns are \"a\", \"b\", \"c\"");
        QTest::newRow("no target given")
            << QStringLiteral("a,b\n1,2\n") << QString() << false
            << QStringLiteral("name the target column (--target-column); the columns are \"a\", \"b\"");
        QTest::newRow("too few fields") << QStringLiteral("a,b,c\n1,2,3\n4,5\n") << QStringLiteral("c") << false
                                        << QStringLiteral("line 3: 2 fields, but the header has 3 columns");
        QTest::newRow("too many fields") << QStringLiteral("a,b\n1,2\n\n3,4,5\n") << QStringLiteral("b") << false
                                         << QStringLiteral("line 4: 3 fields, but the header has 2 columns");
        QTest::newRow("not a number") << QStringLiteral("a,b,c\n1,2,x\n1,abc,0\n") << QStringLiteral("c") << false
                                      << QStringLiteral("line 3, column \"b\": \"abc\" is not a finite number");
        QTest::newRow("nan feature") << QStringLiteral("a,b\nnan,1\n") << QStringLiteral("b") << false
                                     << QStringLiteral("line 2, column \"a\": \"nan\" is not a finite number");
        QTest::newRow("empty target") << QStringLiteral("a,b\n1,\n") << QStringLiteral("b") << false
                                      << QStringLiteral("line 2: the target \"b\" is empty");
        QTest::newRow("regression label") << QStringLiteral("a,b\n1,2\n3,cat\n") << QStringLiteral("b") << true
                                          << QStringLiteral("line 3: the target \"cat\" is not a finite number");
        QTest::newRow("values as classes") << QStringLiteral("a,b\n1,2\n3,0.5\n") << QStringLiteral("b") << false
                                           << QStringLiteral("holds numbers such as 0.5, not class ids");
        QTest::newRow("target column twice") << QStringLiteral("a,y,y\n1,0,1\n2,1,0\n") << QStringLiteral("y") << false
                                             << QStringLiteral("has 2 columns named \"y\"");
        QTest::newRow("empty file") << QString() << QStringLiteral("b") << false << QStringLiteral("is empty");
        QTest::newRow("header only") << QStringLiteral("a,b\n") << QStringLiteral("b") << false
                                     << QStringLiteral("has a header but no data rows");
        QTest::newRow("only target") << QStringLiteral("b\n1\n") << QStringLiteral("b") << false
                                     << QStringLiteral("needs at least one feature column");
        QTest::newRow("regression target beyond 1e18")
            << QStringLiteral("a,b\n1,2\n3,1e300\n") << QStringLiteral("b") << true
            << QStringLiteral("line 3: the target \"1e300\" is too large to train on");
        QTest::newRow("open quote") << QStringLiteral("a,b\n1,\"x\n2,y\n") << QStringLiteral("b") << false
                                    << QStringLiteral("the quoted field starting on line 2 is never closed");
        // A message quotes at most 200 characters of a value, then says how long it is (issue 39:
        // a 50 MB field printed 52 MB of stderr). 199 x's and a 2-byte é: cut before the é.
        QTest::newRow("a 1 MB field") << QStringLiteral("a,b\n1,2\n") + QString(199, QLatin1Char('x')) +
                                             QStringLiteral("\u00e9") + QString(1'000'000, QLatin1Char('y')) +
                                             QStringLiteral(",1\n")
                                      << QStringLiteral("b") << false
                                      << QStringLiteral("line 3, column \"a\": \"") + QString(199, QLatin1Char('x')) +
                                             QStringLiteral("\u2026\" (1000201 bytes) is not a finite number");
        QString wide;
        for (int c = 0; c < 30; ++c) wide += QStringLiteral("c%1,").arg(c);
        QTest::newRow("thirty columns, no target named")
            << wide + QStringLiteral("y\n") + QStringLiteral("1,").repeated(30) + QStringLiteral("0\n")
            << QStringLiteral("label") << false << QStringLiteral("\"c18\", \"c19\" and 11 more");
    }
    void badFilesAreClearErrors() {
        QFETCH(QString, content);
        QFETCH(QString, target);
        QFETCH(bool, regression);
        QFETCH(QString, message);
        QTemporaryDir dir;
        const auto path = write(dir, "bad.csv", content.toStdString());
        auto data = CsvDataset::load(path, target.toStdString(), regression);
        QVERIFY(!data);
        const QString error = QString::fromStdString(data.error());
        QVERIFY2(error.contains(message), qPrintable(error.left(2000)));
        QVERIFY2(error.contains(QStringLiteral("bad.csv")), qPrintable(error.left(2000)));
        QVERIFY2(error.size() < 1000, qPrintable(QStringLiteral("%1 characters").arg(error.size())));
    }

    void missingFileAndPath() {
        auto data = CsvDataset::load("/nonexistent/data.csv", "y", false);
        QVERIFY(!data);
        QVERIFY(QString::fromStdString(data.error()).contains(QStringLiteral("/nonexistent/data.csv does not exist")));
        DataOptions options;
        options.name = "csv";
        auto made = makeDataset(options);
        QVERIFY(!made);
        QVERIFY(QString::fromStdString(made.error()).contains(QStringLiteral("needs a path")));
        options.name = "parquet";
        made = makeDataset(options);
        QVERIFY(!made);
        QVERIFY(QString::fromStdString(made.error())
                    .contains(QStringLiteral("choose synthetic, mnist, image-folder or csv")));
    }

    void mlpLearnsTheTable() {
        // Two Gaussian blobs in 4 features, string labels: the built-in MLP separates them.
        QTemporaryDir dir;
        std::string text = "f0,f1,f2,f3,kind\n";
        torch::manual_seed(3);
        const auto noise = torch::randn({256, 4});
        for (int64_t i = 0; i < 256; ++i) {
            const bool second = i % 2 == 1;
            for (int64_t f = 0; f < 4; ++f) {
                text +=
                    std::to_string(noise[i][f].item<float>() + (second ? 1.5F : -1.5F) * (f < 2 ? 1.0F : 0.0F)) + ",";
            }
            text += second ? "b\n" : "a\n";
        }
        const auto path = write(dir, "blobs.csv", text);
        TrainerOptions o;
        o.model.name = "mlp";
        o.model.width = 8;
        o.data.name = "csv";
        o.data.path = path;
        o.data.targetColumn = "kind";
        o.targetBatch = 32;
        o.steps = 30;
        o.optimizer.kind = OptimizerKind::Adam;
        o.optimizer.learningRate = 1e-2;
        RecordingSink sink;
        Trainer trainer(o, sink);
        const auto result = trainer.run();
        QVERIFY2(result.state == RunState::Finished, qPrintable(QString::fromStdString(result.error)));
        const auto steps = sink.all<StepMetrics>();
        QCOMPARE(steps.size(), size_t{30});
        QVERIFY2(steps.back().loss < 0.5 * steps.front().loss,
                 qPrintable(QStringLiteral("loss %1 → %2").arg(steps.front().loss).arg(steps.back().loss)));
    }
};

}  // namespace tst_csv_dataset

BATCHPILOT_TEST_MAIN(tst_csv_dataset::TestCsvDataset)
#include "tst_csv_dataset.moc"
