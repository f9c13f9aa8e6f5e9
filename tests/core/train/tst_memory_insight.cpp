#include <QtTest>
#include "tests/test_main.h"
#include "core/train/equivalence.h"
#include "core/nn/model.h"
#include "core/train/trainer.h"
#include "tests/core/recording_sink.h"

namespace tst_memory_insight {

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;

namespace {

int64_t bytesOf(const std::vector<torch::Tensor>& tensors) {
    int64_t total = 0;
    for (const auto& t : tensors) total += t.numel() * static_cast<int64_t>(t.element_size());
    return total;
}

TrainerOptions resnet(NormKind norm) {
    TrainerOptions o;
    o.model.name = "resnet";
    o.model.norm = norm;
    o.model.width = 8;
    o.data.samples = 256;
    o.data.height = o.data.width = 16;
    // Exact counting in this file: the breakdown's parts are compared with bytes computed from
    // the tensors, which the caching model would round to its blocks.
    o.device = "virtual:24MiB/exact";
    o.targetBatch = 96;
    o.probe.maxMicroBatch = 32;
    // The largest micro-batch, not the measured fastest: these runs are compared by their split.
    o.probe.objective = ProbeObjective::Largest;
    o.steps = 2;
    return o;
}

struct CheckedRun {
    RunResult result;
    std::vector<EquivalenceChecked> checks;
    size_t parameterTensors = 0;
};

/// Runs `options` and asks for an equivalence check of `samples` after the first step.
CheckedRun runWithCheck(TrainerOptions options, int64_t samples, RecordingSink& sink) {
    Trainer trainer(std::move(options), sink);
    bool asked = false;
    sink.onEach = [&](const Event& e) {
        if (std::holds_alternative<OptimizerStepped>(e) && !asked) {
            asked = true;
            trainer.checkEquivalence(samples);
        }
    };
    RunResult result = trainer.run();
    return {result, sink.all<EquivalenceChecked>(), trainer.model()->parameters().size()};
}

}  // namespace

class TestMemoryInsight : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void breakdownAddsUpToThePeak_data() {
        QTest::addColumn<QString>("model");
        QTest::addColumn<QString>("optimizer");
        QTest::addColumn<QString>("device");
        QTest::addColumn<int>("stateCopies");  // optimizer state in parameter sizes
        QTest::newRow("mlp adam") << "mlp"
                                  << "adam"
                                  << "virtual:16MiB/exact" << 2;
        QTest::newRow("cnn sgd+momentum") << "cnn"
                                          << "sgd"
                                          << "virtual:24MiB/exact" << 1;
        QTest::newRow("resnet groupnorm adamw") << "resnet"
                                                << "adamw"
                                                << "virtual:48MiB/exact" << 2;
    }
    void breakdownAddsUpToThePeak() {
        QFETCH(QString, model);
        QFETCH(QString, optimizer);
        QFETCH(QString, device);
        QFETCH(int, stateCopies);
        TrainerOptions o;
        o.model.name = model.toStdString();
        o.model.width = 16;
        o.data.samples = 512;
        o.data.height = o.data.width = 16;
        o.device = device.toStdString();
        o.targetBatch = 256;
        o.optimizer.kind = *parseOptimizerKind(optimizer.toStdString());
        o.steps = 4;
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Finished);

        const auto breakdowns = sink.all<MemoryBreakdown>();
        QCOMPARE(int(breakdowns.size()), 1 + 4);  // after setup and after every step
        const auto parameters = trainer.model()->parameters();
        const int64_t parameterBytes = bytesOf(parameters);
        const int64_t bufferBytes = bytesOf(trainer.model()->buffers());

        // Before the first step: parameters, gradients and the optimizer state held back for it.
        const MemoryBreakdown& setup = breakdowns.front();
        QCOMPARE(setup.step, int64_t{0});
        QCOMPARE(setup.parameterBytes, parameterBytes + bufferBytes);
        QCOMPARE(setup.gradientBytes, parameterBytes);
        QCOMPARE(setup.activationBytes, int64_t{0});
        QCOMPARE(setup.totalBytes, setup.capacityBytes);

        for (size_t i = 1; i < breakdowns.size(); ++i) {
            const MemoryBreakdown& b = breakdowns[i];
            QCOMPARE(b.step, int64_t(i));
            // Measured independently: parameters at load, gradients at creation, state around
            // the first step; activations per micro-batch. Together they make the peak.
            QCOMPARE(b.parameterBytes, parameterBytes + bufferBytes);
            QCOMPARE(b.gradientBytes, parameterBytes);
            QVERIFY(!b.optimizerStateReserved);
            QCOMPARE(b.optimizerStateBytes, stateCopies * parameterBytes);
            QVERIFY2(b.activationBytes > 0 && b.activationMicroBatch > 0,
                     qPrintable(QString::number(b.activationBytes)));
            const double error = std::abs(double(b.attributedBytes() - b.peakBytes)) / double(b.peakBytes);
            QVERIFY2(error <= 0.02, qPrintable(QStringLiteral("step %1: parts %2 vs peak %3")
                                                   .arg(b.step)
                                                   .arg(b.attributedBytes())
                                                   .arg(b.peakBytes)));
            QVERIFY(b.peakBytes <= b.totalBytes);
            QCOMPARE(b.freeBytes, b.totalBytes - b.peakBytes);
            QCOMPARE(b.cacheBytes, int64_t{0});
            QCOMPARE(b.otherProcessBytes, int64_t{0});
        }
        // The last steps run the plan only: their peak is the chosen micro-batch's.
        const MemoryBreakdown& last = breakdowns.back();
        QCOMPARE(last.activationMicroBatch, sink.all<StepMetrics>().back().microBatch);
    }

    void activationsGrowWithTheMicroBatch() {
        // Same model and data, micro-batch capped at 8 and at 32: activations scale, the
        // resident parts do not.
        auto measure = [](int64_t cap) {
            TrainerOptions o = resnet(NormKind::Group);
            o.device = "virtual:256MiB/exact";
            o.probe.maxMicroBatch = cap;
            o.steps = 3;
            RecordingSink sink;
            Trainer trainer(o, sink);
            trainer.run();
            return sink.all<MemoryBreakdown>().back();
        };
        const MemoryBreakdown small = measure(8);
        const MemoryBreakdown large = measure(32);
        QCOMPARE(small.activationMicroBatch, int64_t{8});
        QCOMPARE(large.activationMicroBatch, int64_t{32});
        QCOMPARE(small.parameterBytes, large.parameterBytes);
        QCOMPARE(small.optimizerStateBytes, large.optimizerStateBytes);
        const double ratio = double(large.activationBytes) / double(small.activationBytes);
        QVERIFY2(ratio > 2.5 && ratio < 4.5, qPrintable(QString::number(ratio)));
    }

    void summaryNamesTheRun() {
        RecordingSink sink;
        Trainer trainer(resnet(NormKind::Batch), sink);
        trainer.run();
        const auto summaries = sink.all<RunSummary>();
        QCOMPARE(int(summaries.size()), 1);
        const RunSummary& s = summaries.front();
        QCOMPARE(s.device, std::string("virtual:24MiB/exact"));
        QCOMPARE(s.parameterCount, trainer.model()->parameterCount());
        QCOMPARE(s.parameterTensors, int64_t(trainer.model()->parameters().size()));
        QCOMPARE(s.inputShape, (std::vector<int64_t>{3, 16, 16}));
        QCOMPARE(s.datasetSize, int64_t{256});
        QCOMPARE(s.targetBatch, int64_t{96});
        QVERIFY(s.batchStatistics);
        QVERIFY(s.optimizer.find("sgd") == 0);
    }

    void groupNormAccumulationIsExact() {
        RecordingSink sink;
        auto [result, checks, tensors] = runWithCheck(resnet(NormKind::Group), 0, sink);
        QCOMPARE(result.state, RunState::Finished);
        QCOMPARE(int(checks.size()), 1);
        const EquivalenceChecked& c = checks.front();
        QCOMPARE(c.tensors.size(), tensors);
        QVERIFY2(c.error.empty(), c.error.c_str());
        QCOMPARE(c.samples, int64_t{96});
        QCOMPARE(c.step, int64_t{1});
        QVERIFY(c.microBatchSizes.size() >= 3);
        int64_t sum = 0;
        for (int64_t n : c.microBatchSizes) sum += n;
        QCOMPARE(sum, c.samples);
        QVERIFY2(c.overall.relativeDifference <= 1e-5, qPrintable(QString::number(c.overall.relativeDifference)));
        QVERIFY(c.overall.relativeDifference > 0 || c.overall.maxAbsDifference == 0);
        QVERIFY(c.overall.cosineSimilarity > 1 - 1e-9);
        QVERIFY(!c.batchStatistics);
        QCOMPARE(c.runningStatisticsRelativeDifference, -1.0);
        QVERIFY(c.explanation.find("float32 rounding") != std::string::npos);
        // Every parameter tensor is compared, by name.
        int64_t elements = 0;
        for (const auto& t : c.tensors) {
            QVERIFY(!t.name.empty());
            QVERIFY(t.name.find("parameter ") != 0);
            elements += t.elements;
        }
        QCOMPARE(c.overall.elements, elements);
    }

    void batchNormDifferenceIsShownAndExplained() {
        RecordingSink sink;
        auto [result, checks, tensors] = runWithCheck(resnet(NormKind::Batch), 0, sink);
        QCOMPARE(result.state, RunState::Finished);
        QCOMPARE(int(checks.size()), 1);
        const EquivalenceChecked& c = checks.front();
        QVERIFY2(c.error.empty(), c.error.c_str());
        QVERIFY(c.batchStatistics);
        // Micro-batch statistics make a real difference, far above rounding ...
        QVERIFY2(c.overall.relativeDifference > 1e-3, qPrintable(QString::number(c.overall.relativeDifference)));
        // ... and it is the statistics: with the running ones the check is exact again.
        QVERIFY2(c.runningStatisticsRelativeDifference >= 0 && c.runningStatisticsRelativeDifference <= 1e-5,
                 qPrintable(QString::number(c.runningStatisticsRelativeDifference)));
        QVERIFY(c.explanation.find("BatchNorm") != std::string::npos);
        QVERIFY(c.explanation.find("own mean and variance") != std::string::npos);
    }

    void checkDoesNotChangeTraining() {
        // Same run with and without a check after step 1: identical losses, so parameters,
        // gradients and BatchNorm statistics were left as they were.
        TrainerOptions o = resnet(NormKind::Batch);
        o.steps = 3;
        RecordingSink plain;
        Trainer(o, plain).run();
        RecordingSink checked;
        auto [result, checks, tensors] = runWithCheck(o, 0, checked);
        QCOMPARE(int(checks.size()), 1);
        const auto a = plain.all<StepMetrics>();
        const auto b = checked.all<StepMetrics>();
        QCOMPARE(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) QCOMPARE(a[i].loss, b[i].loss);
    }

    void fullBatchThatDoesNotFitRunsOutsideTheBudget() {
        // 256 samples of this cnn need far more than 16 MiB in one pass: that is why we accumulate.
        TrainerOptions o;
        o.model.name = "cnn";
        o.model.width = 16;
        o.data.samples = 512;
        o.device = "virtual:16MiB/exact";
        o.targetBatch = 256;
        o.steps = 2;
        RecordingSink sink;
        auto [result, checks, tensors] = runWithCheck(o, 0, sink);
        QCOMPARE(result.state, RunState::Finished);
        QCOMPARE(int(checks.size()), 1);
        const EquivalenceChecked& c = checks.front();
        QVERIFY2(c.error.empty(), c.error.c_str());
        QVERIFY(c.fullPassOutsideBudget);
        QVERIFY(c.overall.relativeDifference <= 1e-5);
        QVERIFY(c.explanation.find("does not fit") != std::string::npos);
        // The check's own out-of-memory error is not a training OOM: no event reports it.
        const auto ooms = sink.all<OomEvent>();
        QVERIFY(
            std::none_of(ooms.begin(), ooms.end(), [&](const OomEvent& e) { return e.time >= c.time - c.seconds; }));
    }

    void smallerCheckBatch() {
        RecordingSink sink;
        auto [result, checks, tensors] = runWithCheck(resnet(NormKind::Group), 40, sink);
        QCOMPARE(int(checks.size()), 1);
        QCOMPARE(checks.front().samples, int64_t{40});
        int64_t sum = 0;
        for (int64_t n : checks.front().microBatchSizes) sum += n;
        QCOMPARE(sum, int64_t{40});
        QVERIFY(checks.front().microBatchSizes.size() >= 2);
    }

    void checkBeforeAnyMicroBatchIsKnownSaysWhy() {
        RecordingSink sink;
        Trainer trainer(resnet(NormKind::Group), sink);
        trainer.checkEquivalence(0);  // applied before the first batch: no micro-batch size yet
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Finished);  // the run is not harmed
        const auto checks = sink.all<EquivalenceChecked>();
        QCOMPARE(int(checks.size()), 1);
        QVERIFY(checks.front().error.find("no micro-batch size is known yet") != std::string::npos);
        QVERIFY(checks.front().tensors.empty());
    }
};

}  // namespace tst_memory_insight

BATCHPILOT_TEST_MAIN(tst_memory_insight::TestMemoryInsight)
#include "tst_memory_insight.moc"
