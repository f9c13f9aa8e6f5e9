#include <QtTest>
#include "tests/test_main.h"

#include <QTemporaryDir>

#include <cmath>
#include <map>

#include <torch/torch.h>

#include "core/data/dataset.h"
#include "core/nn/model.h"
#include "core/train/failure_explanation.h"
#include "core/train/trainer.h"
#include "tests/core/recording_sink.h"

namespace tst_trainer_errors {

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;

namespace {

TrainerOptions small() {
    TrainerOptions o;
    o.model.name = "mlp";
    o.model.width = 8;
    o.data.samples = 128;
    o.data.height = o.data.width = 8;
    o.device = "virtual:256MiB";
    o.targetBatch = 32;
    o.steps = 3;
    return o;
}

/// The run of `o`, its events unread.
RunResult runAlone(const TrainerOptions& o) {
    RecordingSink sink;
    Trainer trainer(o, sink);
    return trainer.run();
}

/// Synthetic images whose pixels become NaN from `poisonFrom` on (by sample index).
class PoisonedImages : public Dataset {
public:
    explicit PoisonedImages(const DataOptions& options) : m_inner(options) {}
    std::string name() const override { return "poisoned"; }
    int64_t size() const override { return m_inner.size(); }
    std::vector<int64_t> sampleShape() const override { return m_inner.sampleShape(); }
    int64_t classes() const override { return m_inner.classes(); }
    Batch get(const std::vector<int64_t>& indices) const override {
        Batch b = m_inner.get(indices);
        b.inputs.fill_(std::numeric_limits<float>::quiet_NaN());
        return b;
    }

private:
    SyntheticImages m_inner;
};

}  // namespace

class TestTrainerErrors : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void shapeErrorIsNotRetried() {
        TrainerOptions o = small();
        // A linear layer expecting the wrong number of inputs: a real (non-OOM) error.
        std::shared_ptr<torch::nn::LinearImpl> layer;
        o.modelFactory = [&](const Dataset&) -> tl::expected<std::shared_ptr<Model>, std::string> {
            layer = std::make_shared<torch::nn::LinearImpl>(7, 10);
            return std::make_shared<ModuleModel>("wrong-shape", layer, [raw = layer.get()](const torch::Tensor& x) {
                return raw->forward(x.flatten(1));
            });
        };
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Failed);
        QCOMPARE(result.steps, qint64(0));
        QVERIFY(sink.all<OomEvent>().empty());
        // Tried exactly once: no second probe trial after the error.
        QCOMPARE(sink.all<ProbeTrial>().size(), size_t(0));
        const auto errors = sink.all<ErrorEvent>();
        QCOMPARE(errors.size(), size_t(1));
        const QString message = QString::fromStdString(errors.front().message);
        const QString where = QString::fromStdString(errors.front().where);
        QVERIFY2(message.contains(QStringLiteral("shapes cannot be multiplied")), qPrintable(message));
        QVERIFY2(where.contains(QStringLiteral("micro-batch 1")) && where.contains(QStringLiteral("forward")),
                 qPrintable(where));
        const auto states = sink.all<RunStateChanged>();
        QCOMPARE(states.back().state, RunState::Failed);
    }

    /// oneDNN's "could not create a primitive" above a size (as PyPI's LibTorch says under memory
    /// pressure): taken for an OOM, the micro-batch shrinks below it and training goes on, every
    /// sample trained; when it fails at every size it is the error it says, not "does not fit".
    void libraryFailureThatMayBeMemory_data() {
        QTest::addColumn<int>("failsAbove");
        QTest::newRow("above 8 samples") << 8;
        QTest::newRow("at every size") << 0;
    }
    void libraryFailureThatMayBeMemory() {
        QFETCH(int, failsAbove);
        TrainerOptions o = small();
        o.reportSampleIndices = true;
        o.probe.objective = ProbeObjective::Largest;
        std::shared_ptr<torch::nn::LinearImpl> layer;
        o.modelFactory = [&](const Dataset& data) -> tl::expected<std::shared_ptr<Model>, std::string> {
            const int64_t inputs = data.sampleShape()[0] * data.sampleShape()[1] * data.sampleShape()[2];
            layer = std::make_shared<torch::nn::LinearImpl>(inputs, data.classes());
            return std::make_shared<ModuleModel>(
                "onednn", layer, [raw = layer.get(), failsAbove](const torch::Tensor& x) {
                    if (x.size(0) > failsAbove)
                        TORCH_CHECK(false, "could not create a primitive descriptor for a matmul primitive");
                    return raw->forward(x.flatten(1));
                });
        };
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        if (failsAbove > 0) {
            QVERIFY2(result.state == RunState::Finished, result.error.c_str());
            QCOMPARE(result.steps, qint64(3));
            QVERIFY(!sink.all<OomEvent>().empty());
            for (const MicroBatchDone& m : sink.committedMicroBatches()) QVERIFY(m.size <= failsAbove);
            std::map<int64_t, int64_t> perStep;
            for (const MicroBatchDone& m : sink.committedMicroBatches()) perStep[m.step] += m.size;
            for (const auto& [step, samples] : perStep) QCOMPARE(samples, qint64(32));
        } else {
            QCOMPARE(result.state, RunState::Failed);
            QVERIFY2(result.error.find("could not create a primitive") != std::string::npos, result.error.c_str());
            QVERIFY2(result.error.find("does not fit") == std::string::npos, result.error.c_str());
        }
    }

    void nanLossStopsWithStateIntact() {
        TrainerOptions o = small();
        o.datasetFactory = [&]() -> tl::expected<std::shared_ptr<Dataset>, std::string> {
            return std::make_shared<PoisonedImages>(o.data);
        };
        torch::manual_seed(o.seed);
        SyntheticImages data(o.data);
        auto reference = *makeBuiltinModel(o.model, data.sampleShape(), data.classes());
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Failed);
        QVERIFY2(
            QString::fromStdString(result.error).contains(QStringLiteral("loss became NaN: the data itself holds NaN")),
            result.error.c_str());
        QVERIFY(sink.all<OomEvent>().empty());
        // The weights are the initial ones: nothing of the failed batch was applied.
        const auto got = trainer.model()->parameters();
        const auto expected = reference->parameters();
        for (size_t i = 0; i < got.size(); ++i) QVERIFY(torch::equal(got[i], expected[i]));
    }

    /// A model whose output is NaN on finite data before any update is named as the cause, not the
    /// learning rate.
    void nanFromTheModelIsBlamedOnTheModel() {
        TrainerOptions o = small();
        std::shared_ptr<torch::nn::LinearImpl> layer;
        o.modelFactory = [&](const Dataset& data) -> tl::expected<std::shared_ptr<Model>, std::string> {
            int64_t features = 1;
            for (const int64_t d : data.sampleShape()) features *= d;
            layer = std::make_shared<torch::nn::LinearImpl>(features, data.classes());
            return std::make_shared<ModuleModel>("nan-model", layer, [raw = layer.get()](const torch::Tensor& x) {
                return raw->forward(x.flatten(1)) * std::numeric_limits<float>::quiet_NaN();
            });
        };
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Failed);
        const QString error = QString::fromStdString(result.error);
        QVERIFY2(error.contains(QStringLiteral("before any weight was updated, so the model itself produces it")),
                 qPrintable(error));
        QVERIFY2(!error.contains(QStringLiteral("learning rate")), qPrintable(error));
    }

    void modelTooBigForDevice() {
        TrainerOptions o = small();
        o.model.name = "resnet";
        o.device = "virtual:2MiB";
        o.data.height = o.data.width = 64;
        const RunResult result = runAlone(o);
        QCOMPARE(result.state, RunState::Failed);
        const QString message = QString::fromStdString(result.error);
        QVERIFY2(message.contains(QStringLiteral("does not fit on virtual:2MiB even at micro-batch 1")),
                 qPrintable(message));
        QVERIFY2(message.contains(QStringLiteral("needs ≈")) && message.contains(QStringLiteral("has 2.0 MiB")),
                 qPrintable(message));
    }

    /// Under PyTorch's caching allocator what runs out is the segments, not the tensors: the
    /// message gives both, and the segments add up by PyTorch's rules (a request of at most
    /// 1 MiB takes a 2 MiB segment, 1-10 MiB a 20 MiB one, larger ones are rounded up to 2 MiB).
    /// Lowering the headroom cannot help when the segments alone exceed the budget, so it is not
    /// the advice.
    void modelTooBigForTheCachingAllocatorNamesItsSegments() {
        TrainerOptions o = small();
        o.model.name = "resnet";
        o.model.width = 32;  // BatchPilot's default
        o.data.height = o.data.width = 32;
        o.device = "virtual:8MiB/caching";
        const RunResult result = runAlone(o);
        QCOMPARE(result.state, RunState::Failed);
        const QString message = QString::fromStdString(result.error);
        const QRegularExpression parts(
            QStringLiteral("needs ≈ ([0-9.]+) MiB of tensors, in PyTorch's caching allocator ([0-9.]+) MiB of segments "
                           "\\(([0-9.]+) MiB reserved and ([0-9.]+) MiB more it tried to reserve"));
        const auto match = parts.match(message);
        QVERIFY2(match.hasMatch(), qPrintable(message));
        const double tensors = match.captured(1).toDouble(), segments = match.captured(2).toDouble();
        const double reserved = match.captured(3).toDouble(), more = match.captured(4).toDouble();
        QCOMPARE(segments, reserved + more);
        QVERIFY2(segments > 8.0 && tensors <= segments, qPrintable(message));
        // Segments are whole multiples of 2 MiB under the allocator's rules.
        QCOMPARE(std::fmod(more, 2.0), 0.0);
        QCOMPARE(std::fmod(reserved, 2.0), 0.0);
        QVERIFY2(message.contains(QStringLiteral("has 8.0 MiB")), qPrintable(message));
        QVERIFY2(!message.contains(QStringLiteral("headroom")), qPrintable(message));
    }

    void parametersAloneTooBig() {
        TrainerOptions o = small();
        o.model.width = 512;  // an MLP of ~50 MiB of parameters
        o.device = "virtual:4MiB";
        const RunResult result = runAlone(o);
        QCOMPARE(result.state, RunState::Failed);
        const QString message = QString::fromStdString(result.error);
        QVERIFY2(message.contains(QStringLiteral("parameters and gradients do not fit on virtual:4MiB")),
                 qPrintable(message));
        // The estimate is about this run, not left over from earlier runs in the process: at
        // least the 4 MiB that were full, far below the gigabytes a stale peak would show.
        const QRegularExpression needs(QStringLiteral("needs ≈ ([0-9.]+) MiB"));
        const auto match = needs.match(message);
        QVERIFY2(match.hasMatch(), qPrintable(message));
        QVERIFY(match.captured(1).toDouble() >= 4.0 && match.captured(1).toDouble() < 200.0);
    }

    void invalidOptionsAreReported_data() {
        QTest::addColumn<QString>("field");
        QTest::newRow("target batch") << QStringLiteral("target batch");
        QTest::newRow("device") << QStringLiteral("unknown device");
        QTest::newRow("model") << QStringLiteral("unknown model");
        QTest::newRow("headroom") << QStringLiteral("headroom");
    }
    void invalidOptionsAreReported() {
        QFETCH(QString, field);
        TrainerOptions o = small();
        if (field == QStringLiteral("target batch")) o.targetBatch = 0;
        if (field == QStringLiteral("unknown device")) o.device = "gpu9";
        if (field == QStringLiteral("unknown model")) o.model.name = "transformer";
        if (field == QStringLiteral("headroom")) o.probe.headroom = 1.5;
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Failed);
        QVERIFY2(QString::fromStdString(result.error).contains(field), result.error.c_str());
        QCOMPARE(sink.all<ErrorEvent>().size(), size_t(1));
    }

    /// Checkpoints the run could not keep are refused before training, as bad input, with the
    /// reason (the front ends normally fill in the run folder, or refuse earlier).
    void checkpointRequestsItCannotKeep_data() {
        QTest::addColumn<QString>("request");
        QTest::addColumn<QString>("message");
        QTest::newRow("interval without a folder")
            << QStringLiteral("interval")
            << QStringLiteral("checkpoints were asked for (an interval) but there is no folder");
        QTest::newRow("best model without a folder")
            << QStringLiteral("best")
            << QStringLiteral("checkpoints were asked for (keeping the best model) but there is no folder");
        QTest::newRow("top-5 with three classes")
            << QStringLiteral("top5") << QStringLiteral("needs more than 5 classes, but the data has 3");
        QTest::newRow("best model of unsplit data")
            << QStringLiteral("unsplit") << QStringLiteral("keeping the best model by val_loss needs validation data");
    }
    void checkpointRequestsItCannotKeep() {
        QFETCH(QString, request);
        QFETCH(QString, message);
        QTemporaryDir dir;
        TrainerOptions o = small();
        if (request == QStringLiteral("interval")) o.checkpoint.everySteps = 2;
        if (request == QStringLiteral("best")) o.checkpoint.keepBest = "val_loss";
        if (request == QStringLiteral("top5")) {
            o.data.classes = 3;
            o.checkpoint.keepBest = "val_top5_accuracy";
            o.checkpoint.directory = dir.path().toStdString();
        }
        if (request == QStringLiteral("unsplit")) {
            // Data from a factory is not split unless asked: no validation data.
            const DataOptions data = o.data;
            o.datasetFactory = [data]() -> tl::expected<std::shared_ptr<Dataset>, std::string> {
                return std::make_shared<SyntheticImages>(data);
            };
            o.checkpoint.keepBest = "val_loss";
            o.checkpoint.directory = dir.path().toStdString();
        }
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Failed);
        QVERIFY(result.badInput);
        QVERIFY2(QString::fromStdString(result.error).contains(message), result.error.c_str());
        QVERIFY(sink.all<StepMetrics>().empty());
        QVERIFY(QDir(dir.path()).isEmpty());  // nothing written
    }

    // What a user reads when a micro-batch fails for a reason other than memory: LibTorch's own
    // words, then what they mean here and what to do. Each row's sentence written out in full, as
    // the user reads it.
    void failuresAreExplained_data() {
        QTest::addColumn<QString>("message");
        QTest::addColumn<int>("size");
        QTest::addColumn<int>("largest");
        QTest::addColumn<QString>("savers");
        QTest::addColumn<bool>("checkpointable");
        QTest::addColumn<QString>("added");  // empty: the message unchanged
        const QString batchNorm =
            QStringLiteral("Expected more than 1 value per channel when training, got input size [1, 64, 1, 1]");
        const QString half = QStringLiteral("\"slow_conv2d_cpu\" not implemented for 'Half'");
        const QString bfloat = QStringLiteral("expected scalar type BFloat16 but found Float");
        QTest::newRow("BatchNorm, micro-batches limited to 1")
            << batchNorm << 1 << 1 << "off" << true
            << " (the model's BatchNorm cannot train on one sample, and micro-batches are limited to 1 here: allow "
               "at least 2 with --max-micro-batch and --target-batch)";
        QTest::newRow("BatchNorm, 2 allowed: the trainer moves to 2 instead")
            << batchNorm << 1 << 8 << "off" << true << "";
        QTest::newRow("BatchNorm at 2 samples: not the single-sample case")
            << batchNorm << 2 << 1 << "off" << true << "";
        QTest::newRow("Half under fp16")
            << half << 4 << 64 << "fp16" << true
            << " (under float16 autocast, the memory savers fp16, a layer of the model got float16 inputs it cannot "
               "take with this LibTorch on this device; train with bf16 or --memory-savers checkpoint)";
        QTest::newRow("Half under checkpoint-fp16, model not checkpointable")
            << half << 4 << 64 << "checkpoint-fp16" << false
            << " (under float16 autocast, the memory savers fp16, a layer of the model got float16 inputs it cannot "
               "take with this LibTorch on this device; train with bf16 or --memory-savers off)";
        QTest::newRow("Half without float16 savers") << half << 4 << 64 << "bf16" << true << "";
        QTest::newRow("BFloat16 under bf16")
            << bfloat << 4 << 64 << "bf16" << true
            << " (under bfloat16 autocast, the memory saver bf16, a layer of the model got inputs of two types, which "
               "this LibTorch rejects; LibTorch 2.1 and later accept them in normalisations; here train without "
               "bf16, e.g. --memory-savers checkpoint)";
        QTest::newRow("BFloat16 under both, model not checkpointable")
            << bfloat << 4 << 64 << "both" << false
            << " (under bfloat16 autocast, the memory saver bf16, a layer of the model got inputs of two types, which "
               "this LibTorch rejects; LibTorch 2.1 and later accept them in normalisations; here train without "
               "bf16, --memory-savers off)";
        QTest::newRow("BFloat16 without bf16 savers") << bfloat << 4 << 64 << "fp16" << true << "";
        QTest::newRow("a shape error") << QStringLiteral("mat1 and mat2 shapes cannot be multiplied (4x7 and 8x10)")
                                       << 4 << 64 << "bf16" << true << "";
    }
    void failuresAreExplained() {
        QFETCH(QString, message);
        QFETCH(int, size);
        QFETCH(int, largest);
        QFETCH(QString, savers);
        QFETCH(bool, checkpointable);
        QFETCH(QString, added);
        const auto parsed = parseMemorySavers(savers.toStdString());
        QVERIFY(parsed);
        const std::string explained =
            explainMicroBatchFailure({message.toStdString(), size, largest, *parsed, checkpointable});
        QCOMPARE(QString::fromStdString(explained), message + added);
    }

    // The same sentence from a real run: the built-in ResNet (two stride-2 stages) with BatchNorm
    // on 4x4 images ends in 1x1 feature maps, and a target batch of 1 allows no micro-batch of two.
    void singleSampleBatchNormIsExplained() {
        TrainerOptions o = small();
        o.model.name = "resnet";
        o.model.norm = NormKind::Batch;
        o.data.height = o.data.width = 4;
        o.targetBatch = 1;
        o.steps = 1;
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Failed);
        QVERIFY2(QString::fromStdString(result.error)
                     .contains(QStringLiteral("Expected more than 1 value per channel when training")),
                 result.error.c_str());
        QVERIFY2(QString::fromStdString(result.error)
                     .contains(QStringLiteral("allow at least 2 with --max-micro-batch and --target-batch")),
                 result.error.c_str());
        QVERIFY(sink.all<StepMetrics>().empty());
    }

    // --max-trials 1 and a first trial too large: the probe ran out of trials, which says nothing
    // of whether one sample fits (issue 39: it said "does not fit … even at micro-batch 1").
    void probeOutOfTrialsSaysSo() {
        TrainerOptions o = small();
        o.model.name = "cnn";
        o.data.height = o.data.width = 32;
        o.data.samples = 1024;
        o.device = "virtual:8MiB";
        o.targetBatch = 512;
        o.probe.initialMicroBatch = 512;  // 512 feature maps of 8x32x32 floats: 16 MiB a layer
        o.probe.maxTrials = 1;
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Failed);
        QVERIFY(result.badInput);
        QVERIFY2(QString::fromStdString(result.error)
                     .contains(QStringLiteral("the probe used up its 1 trial(s) (--max-trials) before any micro-batch "
                                              "fit: the smallest it tried was 512")),
                 result.error.c_str());
        QVERIFY2(!QString::fromStdString(result.error).contains(QStringLiteral("even at micro-batch 1")),
                 result.error.c_str());
        // With trials enough, the same model trains on the same device.
        o.probe.maxTrials = 24;
        o.steps = 1;
        RecordingSink enough;
        QCOMPARE(Trainer(o, enough).run().state, RunState::Finished);
    }

    void batchNormWarns() {
        TrainerOptions o = small();
        o.model.name = "resnet";
        o.model.norm = NormKind::Batch;
        o.steps = 1;
        RecordingSink sink;
        Trainer trainer(o, sink);
        QCOMPARE(trainer.run().state, RunState::Finished);
        const auto warnings = sink.all<Warning>();
        QVERIFY(!warnings.empty());
        QVERIFY(QString::fromStdString(warnings.front().message).contains(QStringLiteral("BatchNorm")));
    }
};

}  // namespace tst_trainer_errors

BATCHPILOT_TEST_MAIN(tst_trainer_errors::TestTrainerErrors)
#include "tst_trainer_errors.moc"
