#include <QtTest>

#include <torch/torch.h>

#include "core/dataset.h"
#include "core/model.h"
#include "core/sampler.h"
#include "core/trainer.h"
#include "recording_sink.h"

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;

namespace {

constexpr int64_t kTarget = 64;

TrainerOptions optionsFor(const QString& model, int64_t microBatch) {
    TrainerOptions o;
    o.model.name = model.toStdString();
    o.model.width = 8;
    o.data.samples = 256;
    o.data.height = o.data.width = 12;
    o.device = "cpu";
    o.targetBatch = kTarget;
    o.steps = 1;
    o.seed = 5;
    // Pin the micro-batch: the probe's first trial is the maximum, so it fits at once.
    o.probe.initialMicroBatch = microBatch;
    o.probe.maxMicroBatch = microBatch;
    // Plain SGD with lr 1 and no momentum: the update is exactly −gradient.
    o.optimizer.kind = OptimizerKind::Sgd;
    o.optimizer.learningRate = 1.0;
    o.optimizer.momentum = 0;
    return o;
}

}  // namespace

class TestGradientEquivalence : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void accumulatedEqualsFullBatch_data() {
        QTest::addColumn<QString>("model");
        QTest::addColumn<qint64>("microBatch");
        for (const auto* model : {"mlp", "cnn"}) {
            for (qint64 micro : {1, 3, 7, 64}) {
                QTest::addRow("%s, micro-batch %lld", model, micro) << QString::fromLatin1(model) << micro;
            }
        }
    }
    void accumulatedEqualsFullBatch() {
        QFETCH(QString, model);
        QFETCH(qint64, microBatch);
        const TrainerOptions options = optionsFor(model, microBatch);

        // Reference: the same initial weights and the same 64 samples in one full pass.
        SyntheticImages data(options.data);
        torch::manual_seed(options.seed);
        auto reference = *makeBuiltinModel(options.model, data.sampleShape(), data.classes());
        std::vector<torch::Tensor> before;
        for (const auto& p : reference->parameters()) before.push_back(p.detach().clone());
        Sampler sampler(data.size(), options.seed);
        const Batch batch = data.get(sampler.next(kTarget));
        auto loss = torch::nn::functional::cross_entropy(reference->forward(batch.inputs), batch.targets);
        const auto fullGradient = torch::autograd::grad({loss}, reference->parameters());

        RecordingSink sink;
        Trainer trainer(options, sink);
        const RunResult result = trainer.run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        QCOMPARE(result.microBatch, microBatch);
        const auto microBatches = sink.all<MicroBatchDone>();
        QCOMPARE(qint64(microBatches.size()), (kTarget + microBatch - 1) / microBatch);
        QCOMPARE(sink.all<OptimizerStepped>().size(), size_t(1));

        const auto after = trainer.model()->parameters();
        double worst = 0;
        double scale = 0;
        for (size_t i = 0; i < after.size(); ++i) {
            const auto accumulated = before[i] - after[i].detach();  // = lr · gradient
            worst = std::max(worst, (accumulated - fullGradient[i]).abs().max().item<double>());
            scale = std::max(scale, fullGradient[i].abs().max().item<double>());
        }
        QVERIFY(scale > 0);
        QVERIFY2(worst <= 1e-5 * scale,
                 qPrintable(QStringLiteral("max abs difference %1, gradient scale %2").arg(worst).arg(scale)));
    }

    void lossWeightsAreSizeOverTarget() {
        RecordingSink sink;
        Trainer trainer(optionsFor(QStringLiteral("mlp"), 7), sink);
        QVERIFY(trainer.run().state == RunState::Finished);
        double total = 0;
        int64_t offset = 0;
        for (const auto& m : sink.all<MicroBatchDone>()) {
            QCOMPARE(m.lossWeight, double(m.size) / double(kTarget));
            QCOMPARE(m.offset, offset);
            offset += m.size;
            total += m.lossWeight;
        }
        QCOMPARE(offset, kTarget);
        QVERIFY(std::abs(total - 1.0) < 1e-12);
    }
};

QTEST_APPLESS_MAIN(TestGradientEquivalence)
#include "tst_gradient_equivalence.moc"
