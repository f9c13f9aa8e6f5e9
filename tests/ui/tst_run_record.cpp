#include <QtTest>
#include "tests/test_main.h"

#include <QJsonDocument>
#include <QJsonObject>
#include <QTemporaryDir>

#include "ui/report/run_record.h"

namespace tst_run_record {

using namespace batchpilot;

namespace {

core::StepMetrics step(int64_t n) {
    core::StepMetrics m;
    m.time = 0.5 * static_cast<double>(n);
    m.step = n;
    m.samplesSeen = 64 * n;
    m.loss = 2.0 / static_cast<double>(n);
    m.microBatch = 16;
    m.accumulationSteps = 4;
    m.targetBatch = 64;
    m.peakBytes = 1000 + n;
    return m;
}

QStringList jsonTypes(const QString& path) {
    QFile file(path);
    if (!file.open(QIODevice::ReadOnly)) return {};
    QStringList types;
    for (const QByteArray& line : file.readAll().trimmed().split('\n'))
        types << QJsonDocument::fromJson(line).object().value(QStringLiteral("type")).toString();
    return types;
}

}  // namespace

class TestRunRecord : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void eventsComeBackInTheirOrder() {
        ui::RunRecord record;
        record.handle(core::RunStateChanged{0.0, core::RunState::Starting, "virtual:64MiB"});
        record.handle(core::ProbeStarted{});
        record.handle(step(1));
        record.handle(core::MemorySample{});  // drawn only, not kept
        record.handle(core::OptimizerStepped{0.6, 1, 4});
        record.handle(step(2));
        record.handle(core::MemoryBreakdown{});  // per step, not kept
        record.handle(core::Warning{1.1, "careful"});
        record.handle(step(3));
        QCOMPARE(record.stepCount(), std::size_t(3));
        QCOMPARE(record.eventCount(), std::size_t(4));  // the steps are not among the events
        QTemporaryDir dir;
        const QString path = dir.filePath(QStringLiteral("events.jsonl"));
        QVERIFY(record.writeEventsJsonl(path));
        QCOMPARE(jsonTypes(path),
                 (QStringList{QStringLiteral("state"), QStringLiteral("probe_started"), QStringLiteral("step"),
                              QStringLiteral("optimizer_step"), QStringLiteral("step"), QStringLiteral("warning"),
                              QStringLiteral("step")}));
    }

    void manyStepsCostDiskNotMemory() {
        ui::RunRecord record;
        constexpr int64_t kSteps = 200'000;
        for (int64_t i = 1; i <= kSteps; ++i) record.handle(step(i));
        QCOMPARE(record.stepCount(), std::size_t(kSteps));
        // 200,000 steps are 20 MB as structs; the record keeps them on disk.
        QVERIFY2(record.memoryBytes() < 64 * 1024, qPrintable(QString::number(record.memoryBytes())));
        const auto steps = record.steps();
        QCOMPARE(steps.size(), std::size_t(kSteps));
        QCOMPARE(steps.front().step, int64_t{1});
        QCOMPARE(steps.back().step, kSteps);
        QCOMPARE(steps.back().loss, 2.0 / double(kSteps));
        QCOMPARE(steps[12345].peakBytes, int64_t{1000 + 12346});

        QTemporaryDir dir;
        const QString csv = dir.filePath(QStringLiteral("metrics.csv"));
        QVERIFY(record.writeMetricsCsv(csv));
        QFile file(csv);
        QVERIFY(file.open(QIODevice::ReadOnly));
        const QList<QByteArray> rows = file.readAll().trimmed().split('\n');
        QCOMPARE(rows.size(), int(kSteps) + 1);
        QVERIFY(rows[1].startsWith("1,0,0.5000,64,2,16,4,64,"));
        // More steps after an export keep going to the same record.
        record.handle(step(kSteps + 1));
        QCOMPARE(record.steps().back().step, kSteps + 1);
    }

    void clearForgetsEverything() {
        ui::RunRecord record;
        record.handle(core::Warning{0.1, "old run"});
        record.handle(step(1));
        record.clear();
        QCOMPARE(record.stepCount(), std::size_t(0));
        QCOMPARE(record.eventCount(), std::size_t(0));
        QVERIFY(record.steps().empty());
        record.handle(step(7));
        QCOMPARE(record.steps().size(), std::size_t(1));
        QCOMPARE(record.steps().front().step, int64_t{7});
    }

    void unwritablePathSaysWhy() {
        ui::RunRecord record;
        record.handle(step(1));
        QString error;
        QVERIFY(!record.writeMetricsCsv(QStringLiteral("/nonexistent-folder/metrics.csv"), &error));
        QVERIFY(!error.isEmpty());
        QVERIFY(!record.writeEventsJsonl(QStringLiteral("/nonexistent-folder/events.jsonl"), &error));
    }
};

}  // namespace tst_run_record

BATCHPILOT_TEST_MAIN(tst_run_record::TestRunRecord)
#include "tst_run_record.moc"
