// As much room as a plain training loop: BatchPilot against the yardstick (yardstick/plain_loop.h),
// a LibTorch loop written as a PyTorch user writes one, on the same virtual GPU. For each model kind
// and optimizer: the probe's micro-batch is at least 0.98 of the plain loop's largest, training at
// it runs with no OOM, BatchPilot's peak at one micro-batch size is the plain loop's (no second set
// of gradients), and the memory report's parameters, gradients and optimizer state are what the
// parameter count and the optimizer's rules say.

#include <QtTest>
#include "tests/test_main.h"

#include <cstdlib>
#include <filesystem>

#include <torch/torch.h>

#include "core/data/dataset.h"
#include "core/nn/model_factory.h"
#include "core/train/trainer.h"
#include "tests/core/recording_sink.h"
#include "yardstick/plain_loop.h"

Q_DECLARE_METATYPE(batchpilot::yardstick::PlainLoopSetup)

namespace tst_memory_parity {

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;
using batchpilot::yardstick::PlainLoopSetup;

namespace {

constexpr int64_t kMiB = 1024 * 1024;

PlainLoopSetup setup(const std::string& model, int64_t width, int64_t side, OptimizerKind optimizer, double momentum,
                     int64_t budgetBytes) {
    PlainLoopSetup s;
    s.model.name = model;
    s.model.width = width;
    s.data.channels = 3;
    s.data.height = side;
    s.data.width = side;
    s.optimizer.kind = optimizer;
    s.optimizer.momentum = momentum;
    s.optimizer.learningRate = optimizer == OptimizerKind::Sgd ? 0.05 : 0.001;
    s.budgetBytes = budgetBytes;
    return s;
}

/// BatchPilot on the setup's device, with headroom 0 and the probe after the largest size.
TrainerOptions trainerOptions(const PlainLoopSetup& s, int64_t targetBatch, int steps) {
    TrainerOptions o;
    o.model = s.model;
    o.data = s.data;
    o.data.samples = targetBatch * steps;  // every batch full: no short last batch of an epoch
    o.device = s.deviceName();             // exact counting, as the plain loop's
    o.optimizer = s.optimizer;
    o.targetBatch = targetBatch;
    o.steps = steps;
    o.seed = 1;
    o.probe.headroom = 0;
    o.probe.objective = ProbeObjective::Largest;
    o.validation.split = 0;
    return o;
}

/// Optimizer state per parameter, in parameter copies, by the optimizer's rules: SGD's momentum
/// buffer, Adam's and AdamW's two moments.
int stateCopies(const PlainLoopSetup& s) {
    if (s.optimizer.kind == OptimizerKind::Sgd) return s.optimizer.momentum > 0 ? 1 : 0;
    return 2;
}

/// The model's parameter and buffer bytes, from the model itself (not from any meter).
std::pair<int64_t, int64_t> modelBytes(const PlainLoopSetup& s) {
    DataOptions data = s.data;
    data.samples = 16;
    auto dataset = makeDataset(data);
    auto model = makeModel(s.model, **dataset);
    int64_t parameters = 0;
    int64_t buffers = 0;
    for (const auto& p : (*model)->parameters()) parameters += static_cast<int64_t>(p.nbytes());
    for (const auto& b : (*model)->buffers()) buffers += static_cast<int64_t>(b.nbytes());
    return {parameters, buffers};
}

bool near(int64_t actual, int64_t expected, double tolerance) {
    return std::abs(static_cast<double>(actual - expected)) <= tolerance * static_cast<double>(expected);
}

QString mib(int64_t bytes) {
    return QString::number(static_cast<double>(bytes) / kMiB, 'f', 3) + QStringLiteral(" MiB");
}

}  // namespace

class TestMemoryParity : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase() {
        // oneDNN's convolutions (Debian's LibTorch 1.13) hold extra memory whose size depends on
        // what ran before in the process: the TorchScript ResNet below needs 106 MiB at
        // micro-batch 16 in a process's first run and 142 MiB in every later one, for either loop.
        // What is compared here is the two loops' own memory, so both run without it.
        at::globalContext().setUserEnabledMkldnn(false);
    }
    void asMuchRoomAsAPlainLoop_data() {
        QTest::addColumn<PlainLoopSetup>("loop");
        QTest::addColumn<int64_t>("upper");
        // Exported by the CTest fixture (tests/models/export_models.py); without it those rows fail.
        const std::string models = qEnvironmentVariable("BATCHPILOT_USER_MODELS").toStdString();
        QTest::newRow("mlp, SGD") << setup("mlp", 16, 16, OptimizerKind::Sgd, 0.9, 6 * kMiB) << int64_t{4096};
        QTest::newRow("mlp, SGD without momentum")
            << setup("mlp", 16, 16, OptimizerKind::Sgd, 0.0, 5 * kMiB) << int64_t{4096};
        QTest::newRow("mlp, Adam") << setup("mlp", 16, 16, OptimizerKind::Adam, 0.9, 6 * kMiB) << int64_t{4096};
        // Parameters dominate (16 MiB of them, a 3072×1024 first layer): where a second set of
        // gradients costs the most room (the issue's `--model mlp --width 128`).
        QTest::newRow("mlp width 128, Adam")
            << setup("mlp", 128, 32, OptimizerKind::Adam, 0.9, 96 * kMiB) << int64_t{4096};
        QTest::newRow("cnn, SGD") << setup("cnn", 16, 32, OptimizerKind::Sgd, 0.9, 16 * kMiB) << int64_t{1024};
        QTest::newRow("cnn, AdamW") << setup("cnn", 16, 32, OptimizerKind::AdamW, 0.9, 16 * kMiB) << int64_t{1024};
        QTest::newRow("resnet, Adam") << setup("resnet", 8, 32, OptimizerKind::Adam, 0.9, 24 * kMiB) << int64_t{256};
        PlainLoopSetup batchNorm = setup("resnet", 8, 32, OptimizerKind::Sgd, 0.9, 24 * kMiB);
        batchNorm.model.norm = NormKind::Batch;
        QTest::newRow("resnet with BatchNorm, SGD") << batchNorm << int64_t{256};
        QTest::newRow("TorchScript ResNet, SGD")
            << setup(models + "/resnet_gn_scripted.pt", 32, 32, OptimizerKind::Sgd, 0.9, 80 * kMiB) << int64_t{256};
        QTest::newRow("TorchScript transformer, Adam")
            << setup(models + "/transformer_scripted.pt", 32, 32, OptimizerKind::Adam, 0.9, 96 * kMiB) << int64_t{256};
    }
    void asMuchRoomAsAPlainLoop() {
        QFETCH(PlainLoopSetup, loop);
        QFETCH(int64_t, upper);
        if (loop.model.name.ends_with(".pt")) QVERIFY(std::filesystem::exists(loop.model.name));
        const int64_t plain = batchpilot::yardstick::plainLoopLargest(loop, upper);
        QVERIFY2(plain > 8 && plain < upper,
                 qPrintable(QStringLiteral("the budget must bound the plain loop's micro-batch: %1").arg(plain)));

        // The probe, then training at what it found: no OOM once it is done.
        RecordingSink sink;
        {
            Trainer trainer(trainerOptions(loop, upper, 2), sink);
            const RunResult result = trainer.run();
            QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        }
        const auto finished = sink.all<ProbeFinished>();
        QVERIFY(!finished.empty());
        const int64_t found = finished.front().microBatch;
        qInfo("plain loop's largest %lld, BatchPilot's probe %lld (%.3f)", static_cast<long long>(plain),
              static_cast<long long>(found), static_cast<double>(found) / static_cast<double>(plain));
        QVERIFY2(static_cast<double>(found) >= 0.98 * static_cast<double>(plain),
                 qPrintable(QStringLiteral("BatchPilot %1 against the plain loop's %2").arg(found).arg(plain)));
        QCOMPARE(sink.oomsAfterFirstProbe(), 0);

        // The memory report: parameters, gradients and optimizer state from the parameter count.
        const auto [parameterBytes, bufferBytes] = modelBytes(loop);
        const MemoryBreakdown b = sink.all<MemoryBreakdown>().back();
        // What loading the model adds: its parameters and buffers, and a TorchScript model's own
        // constant tensors (measured: 128 KiB for the transformer with torch 2.15, none with 1.13).
        QVERIFY2(b.parameterBytes >= parameterBytes + bufferBytes &&
                     near(b.parameterBytes, parameterBytes + bufferBytes, 0.02),
                 qPrintable(mib(b.parameterBytes) + QStringLiteral(" reported, parameters ") + mib(parameterBytes) +
                            QStringLiteral(" and buffers ") + mib(bufferBytes)));
        QVERIFY2(near(b.gradientBytes, parameterBytes, 0.01), qPrintable(mib(b.gradientBytes)));
        const int64_t state = stateCopies(loop) * parameterBytes;
        QVERIFY2(state == 0 ? b.optimizerStateBytes == 0 : near(b.optimizerStateBytes, state, 0.01),
                 qPrintable(mib(b.optimizerStateBytes) + QStringLiteral(" for ") + mib(state)));
        // Parameters, gradients and optimizer state within 1% of what the rules say, and what stays
        // between micro-batches: those three and BatchPilot's copy of the buffers.
        const int64_t fixed = parameterBytes + bufferBytes + parameterBytes + state;
        QVERIFY2(near(b.parameterBytes + b.gradientBytes + b.optimizerStateBytes, fixed, 0.01),
                 qPrintable(mib(b.parameterBytes + b.gradientBytes + b.optimizerStateBytes) + QStringLiteral(" for ") +
                            mib(fixed)));
        qInfo(
            "resident between micro-batches %lld bytes: parameters, gradients and optimizer state %lld, buffers %lld "
            "(optimizer state reported %lld)",
            static_cast<long long>(b.residentBytes), static_cast<long long>(fixed), static_cast<long long>(bufferBytes),
            static_cast<long long>(b.optimizerStateBytes));
        QVERIFY2(b.residentBytes >= fixed && near(b.residentBytes, fixed + bufferBytes, 0.01),
                 qPrintable(mib(b.residentBytes) + QStringLiteral(" resident for ") + mib(fixed)));

        // At one micro-batch size both loops peak alike: BatchPilot holds no second set of
        // gradients (a second set would add a whole gradientBytes).
        const int64_t m = found;
        const auto plainRun = batchpilot::yardstick::runPlainLoop(loop, m, 2 * m, /*steps=*/2);
        QVERIFY2(
            plainRun.fit,
            qPrintable(QStringLiteral("the plain loop at %1: %2").arg(m).arg(QString::fromStdString(plainRun.error))));
        QVERIFY2(near(plainRun.fixedBytes, fixed, 0.01), qPrintable(mib(plainRun.fixedBytes)));
        RecordingSink fixedSink;
        TrainerOptions o = trainerOptions(loop, 2 * m, 2);
        o.probe.initialMicroBatch = m;
        o.probe.maxMicroBatch = m;
        Trainer trainer(o, fixedSink);
        const RunResult result = trainer.run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        const MemoryBreakdown at = fixedSink.all<MemoryBreakdown>().back();
        QCOMPARE(at.activationMicroBatch, m);
        qInfo(
            "at micro-batch %lld: peak %lld bytes BatchPilot (resident %lld, input %lld, activations %lld), %lld the "
            "plain loop (fixed %lld)",
            static_cast<long long>(m), static_cast<long long>(at.peakBytes), static_cast<long long>(at.residentBytes),
            static_cast<long long>(at.inputBytes), static_cast<long long>(at.activationBytes),
            static_cast<long long>(plainRun.peakBytes), static_cast<long long>(plainRun.fixedBytes));
        QVERIFY2(static_cast<double>(at.peakBytes) <=
                     1.01 * static_cast<double>(plainRun.peakBytes) + 2.0 * static_cast<double>(bufferBytes),
                 qPrintable(QStringLiteral("BatchPilot's peak %1 against the plain loop's %2")
                                .arg(mib(at.peakBytes), mib(plainRun.peakBytes))));
        // Every byte of that peak is named.
        QVERIFY2(near(at.attributedBytes(), at.peakBytes, 0.001),
                 qPrintable(mib(at.attributedBytes()) + QStringLiteral(" named of ") + mib(at.peakBytes)));
        QCOMPARE(at.bufferCopyBytes, 2 * bufferBytes);
    }
};

}  // namespace tst_memory_parity

BATCHPILOT_TEST_MAIN(tst_memory_parity::TestMemoryParity)
#include "tst_memory_parity.moc"
