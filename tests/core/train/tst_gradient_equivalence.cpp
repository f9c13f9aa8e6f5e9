#include <QtTest>
#include "tests/test_main.h"

#include <cmath>

#include <torch/script.h>
#include <torch/torch.h>

#include "core/data/dataset.h"
#include "core/nn/model.h"
#include "core/data/sampler.h"
#include "core/nn/torchscript_model.h"
#include "core/train/equivalence.h"
#include "core/train/trainer.h"
#include "tests/core/recording_sink.h"

namespace tst_gradient_equivalence {

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
    o.probe.objective = ProbeObjective::Largest;  // exactly this micro-batch, not a faster one
    // Plain SGD with lr 1 and no momentum: the update is exactly −gradient.
    o.optimizer.kind = OptimizerKind::Sgd;
    o.optimizer.learningRate = 1.0;
    o.optimizer.momentum = 0;
    return o;
}

/// A small convolutional classifier written in TorchScript (3x12x12 inputs, 10 classes).
std::string saveScriptedModel(const QTemporaryDir& dir) {
    torch::manual_seed(3);
    torch::jit::Module module("Net");
    module.register_parameter("w1", (0.2 * torch::randn({8, 3, 3, 3})).requires_grad_(), false);
    module.register_parameter("b1", torch::zeros({8}).requires_grad_(), false);
    module.register_parameter("w2", (0.2 * torch::randn({8, 10})).requires_grad_(), false);
    module.register_parameter("b2", torch::zeros({10}).requires_grad_(), false);
    module.define(R"(
def forward(self, x):
    h = torch.relu(torch.conv2d(x, self.w1, self.b1, [1, 1], [1, 1]))
    return torch.matmul(h.mean([2, 3]), self.w2) + self.b2
)");
    const std::string path = dir.filePath(QStringLiteral("net.pt")).toStdString();
    module.save(path);
    return path;
}

}  // namespace

class TestGradientEquivalence : public QObject {
    Q_OBJECT
private Q_SLOTS:
    // The comparison behind "accumulation is exact", on tensors whose differences are worked out
    // by hand (issue 38: every other test read the check's own numbers, so a comparison that
    // always said "equal" would have passed).
    void comparisonOfHandMadeGradients() {
        // a = [3, 4] (norm 5) against [3, 4]: equal. b = [1, 0, 0] against [0, 1, 0]: orthogonal,
        // the difference [1, -1, 0] has norm √2 against the full gradient's 1.
        const std::vector<torch::Tensor> full{torch::tensor({3.0F, 4.0F}), torch::tensor({0.0F, 1.0F, 0.0F})};
        const std::vector<torch::Tensor> accumulated{torch::tensor({3.0F, 4.0F}), torch::tensor({1.0F, 0.0F, 0.0F})};
        EquivalenceChecked r;
        compareGradients({"a", "b"}, accumulated, full, r);
        QCOMPARE(r.tensors.size(), size_t{2});
        QCOMPARE(QString::fromStdString(r.tensors[0].name), QStringLiteral("a"));
        QCOMPARE(r.tensors[0].elements, int64_t{2});
        QCOMPARE(r.tensors[0].maxAbsDifference, 0.0);
        QCOMPARE(r.tensors[0].relativeDifference, 0.0);
        QVERIFY(std::abs(r.tensors[0].cosineSimilarity - 1.0) < 1e-12);
        QCOMPARE(r.tensors[1].elements, int64_t{3});
        QCOMPARE(r.tensors[1].maxAbsDifference, 1.0);
        QVERIFY(std::abs(r.tensors[1].relativeDifference - std::sqrt(2.0)) < 1e-12);
        QVERIFY(std::abs(r.tensors[1].cosineSimilarity) < 1e-12);
        // All together: the difference [0, 0, 1, -1, 0] (norm √2) against [3, 4, 0, 1, 0] (norm
        // √26); cosine (9 + 16) / (√26 · √26) = 25/26.
        QCOMPARE(r.overall.elements, int64_t{5});
        QCOMPARE(r.overall.maxAbsDifference, 1.0);
        QVERIFY(std::abs(r.overall.relativeDifference - std::sqrt(2.0 / 26.0)) < 1e-12);
        QVERIFY(std::abs(r.overall.cosineSimilarity - 25.0 / 26.0) < 1e-12);
        QVERIFY(!r.equalUpToRounding());

        // One micro-batch of two weighted 1/2 where its share of the batch is 1/4: the check's
        // verdict on a wrongly weighted accumulation of a real gradient is "not equal".
        torch::manual_seed(3);
        const torch::Tensor w = torch::randn({4, 3}, torch::requires_grad());
        const torch::Tensor x = torch::randn({8, 3});
        const auto gradientOf = [&](const torch::Tensor& rows, double weight) {
            if (w.grad().defined()) w.grad().zero_();
            (torch::mm(rows, w.t()).pow(2).mean() * weight).backward();
            return w.grad().clone();
        };
        const torch::Tensor wholeBatch = gradientOf(x, 1.0);
        const torch::Tensor right = gradientOf(x.slice(0, 0, 2), 0.25) + gradientOf(x.slice(0, 2, 8), 0.75);
        const torch::Tensor wrong = gradientOf(x.slice(0, 0, 2), 0.5) + gradientOf(x.slice(0, 2, 8), 0.75);
        EquivalenceChecked exact;
        compareGradients({"w"}, {right}, {wholeBatch}, exact);
        QVERIFY2(exact.equalUpToRounding(), qPrintable(QString::number(exact.overall.relativeDifference)));
        EquivalenceChecked broken;
        compareGradients({"w"}, {wrong}, {wholeBatch}, broken);
        QVERIFY2(!broken.equalUpToRounding(), qPrintable(QString::number(broken.overall.relativeDifference)));
        QVERIFY(broken.overall.relativeDifference > 0.01);
    }

    void accumulatedEqualsFullBatch_data() {
        QTest::addColumn<QString>("model");
        QTest::addColumn<qint64>("microBatch");
        for (const auto* model : {"mlp", "cnn", "resnet", "torchscript"}) {
            for (qint64 micro : {1, 3, 7, 64}) {
                QTest::addRow("%s, micro-batch %lld", model, micro) << QString::fromLatin1(model) << micro;
            }
        }
    }
    void accumulatedEqualsFullBatch() {
        QFETCH(QString, model);
        QFETCH(qint64, microBatch);
        TrainerOptions options = optionsFor(model, microBatch);
        QTemporaryDir dir;
        if (model == QStringLiteral("torchscript")) options.model.name = saveScriptedModel(dir);

        // Reference: the same initial weights and the same 64 samples in one full pass.
        SyntheticImages data(options.data);
        torch::manual_seed(options.seed);
        auto made = model == QStringLiteral("torchscript")
                        ? loadTorchScriptModel(options.model.name, data)
                        : makeBuiltinModel(options.model, data.sampleShape(), data.classes());
        QVERIFY2(made, made ? "" : made.error().c_str());
        auto reference = *made;
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

        // Each tensor on its own scale: a small tensor's error is not hidden behind a large one's.
        const auto after = trainer.model()->parameters();
        QCOMPARE(after.size(), fullGradient.size());
        const auto names = trainer.model()->parameterNames();
        for (size_t i = 0; i < after.size(); ++i) {
            const auto accumulated = before[i] - after[i].detach();  // = lr · gradient
            const double worst = (accumulated - fullGradient[i]).abs().max().item<double>();
            const double scale = fullGradient[i].abs().max().item<double>();
            QVERIFY2(worst <= 1e-5 * scale + 1e-9,
                     qPrintable(QStringLiteral("%1: max abs difference %2, its gradient's scale %3")
                                    .arg(QString::fromStdString(names[i]))
                                    .arg(worst)
                                    .arg(scale)));
        }
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

}  // namespace tst_gradient_equivalence

BATCHPILOT_TEST_MAIN(tst_gradient_equivalence::TestGradientEquivalence)
#include "tst_gradient_equivalence.moc"
