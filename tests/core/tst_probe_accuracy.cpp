#include <QtTest>

#include <map>

#include "core/trainer.h"
#include "recording_sink.h"

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;

namespace {

TrainerOptions base(const QString& model, const QString& device) {
    TrainerOptions o;
    o.model.name = model.toStdString();
    o.model.width = 16;
    o.data.samples = 4096;
    o.data.height = o.data.width = 16;
    o.device = device.toStdString();
    o.targetBatch = 4096;
    o.steps = 3;  // a probe may continue into the next training batch
    o.probe.headroom = 0;
    o.optimizer.kind = OptimizerKind::Adam;
    return o;
}

/// Whether the trainer's own first trial at micro-batch n fits on the device.
bool fits(const QString& model, const QString& device, int64_t n) {
    TrainerOptions o = base(model, device);
    o.targetBatch = n;
    o.probe.initialMicroBatch = n;
    o.probe.maxMicroBatch = n;
    o.steps = 1;
    RecordingSink sink;
    Trainer trainer(o, sink);
    trainer.run();
    const auto trials = sink.all<ProbeTrial>();
    return !trials.empty() && trials.front().microBatch == n && trials.front().fit;
}

/// The true largest micro-batch: bisection over real runs, then every size just above is checked
/// so that the answer is the exact boundary, not an estimate.
int64_t trueMaximum(const QString& model, const QString& device) {
    int64_t lo = 0;
    int64_t hi = 4096;
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        (fits(model, device, mid) ? lo : hi) = mid;
    }
    for (int64_t n = lo + 1; n <= lo + 3; ++n) {
        if (fits(model, device, n)) lo = n;
    }
    return lo;
}

}  // namespace

class TestProbeAccuracy : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void findsNearTrueMaximum_data() {
        QTest::addColumn<QString>("model");
        QTest::addColumn<QString>("device");
        QTest::newRow("mlp, 6 MiB") << QStringLiteral("mlp") << QStringLiteral("virtual:6MiB");
        QTest::newRow("mlp, 16 MiB") << QStringLiteral("mlp") << QStringLiteral("virtual:16MiB");
        QTest::newRow("cnn, 24 MiB") << QStringLiteral("cnn") << QStringLiteral("virtual:24MiB");
        QTest::newRow("cnn, 64 MiB") << QStringLiteral("cnn") << QStringLiteral("virtual:64MiB");
    }
    void findsNearTrueMaximum() {
        QFETCH(QString, model);
        QFETCH(QString, device);
        const int64_t truth = trueMaximum(model, device);
        QVERIFY2(truth > 8 && truth < 4096,
                 qPrintable(QStringLiteral("budget must bound the micro-batch, true max %1").arg(truth)));

        RecordingSink sink;
        Trainer trainer(base(model, device), sink);
        const RunResult result = trainer.run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        const auto finished = sink.all<ProbeFinished>();
        QVERIFY(!finished.empty());
        const auto& probe = finished.front();
        const auto trials = sink.all<ProbeTrial>();
        QVERIFY(int(trials.size()) >= probe.trials);
        qInfo("%s on %s: probe %lld of true %lld (%.1f%%) in %d trials", qPrintable(model), qPrintable(device),
              static_cast<long long>(probe.microBatch), static_cast<long long>(truth),
              100.0 * double(probe.microBatch) / double(truth), probe.trials);
        QVERIFY2(probe.microBatch <= truth, "the probe chose a size that does not fit");
        QVERIFY2(double(probe.microBatch) >= 0.97 * double(truth),
                 qPrintable(QStringLiteral("probe %1 vs true %2").arg(probe.microBatch).arg(truth)));
        QVERIFY2(probe.trials <= 14, qPrintable(QStringLiteral("%1 trials").arg(probe.trials)));
        // The trials that fit were real micro-batches of the training batches: every step still
        // committed exactly 4096 samples, none discarded.
        std::map<int64_t, int64_t> committed;
        for (const auto& m : sink.all<MicroBatchDone>()) committed[m.step] += m.size;
        QCOMPARE(committed.size(), size_t(3));
        for (const auto& [step, samples] : committed) QCOMPARE(samples, qint64(4096));
    }
};

QTEST_APPLESS_MAIN(TestProbeAccuracy)
#include "tst_probe_accuracy.moc"
