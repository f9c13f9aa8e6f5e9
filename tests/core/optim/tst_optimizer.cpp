#include <QtTest>
#include "tests/test_main.h"

#include <torch/torch.h>

#include "core/optim/optimizer.h"

namespace tst_optimizer {

using namespace batchpilot::core;

namespace {

std::vector<torch::Tensor> makeParameters() {
    torch::manual_seed(3);
    return {torch::randn({5, 7}), torch::randn({7}), torch::randn({2, 3, 3, 3})};
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& ts) {
    std::vector<torch::Tensor> out;
    for (const auto& t : ts) out.push_back(t.clone());
    return out;
}

double maxDifference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
    return worst;
}

}  // namespace

class TestOptimizer : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void matchesLibTorch_data() {
        QTest::addColumn<int>("kind");
        QTest::addColumn<double>("weightDecay");
        QTest::newRow("sgd momentum") << int(OptimizerKind::Sgd) << 0.0;
        QTest::newRow("sgd momentum, L2") << int(OptimizerKind::Sgd) << 0.01;
        QTest::newRow("adam") << int(OptimizerKind::Adam) << 0.0;
        QTest::newRow("adam, L2") << int(OptimizerKind::Adam) << 0.01;
        QTest::newRow("adamw") << int(OptimizerKind::AdamW) << 0.05;
    }
    void matchesLibTorch() {
        QFETCH(int, kind);
        QFETCH(double, weightDecay);
        OptimizerOptions options;
        options.kind = OptimizerKind(kind);
        options.learningRate = 0.01;
        options.weightDecay = weightDecay;

        auto ours = makeParameters();
        auto theirs = clones(ours);
        for (auto& t : theirs) t.set_requires_grad(true);
        Optimizer optimizer(options, ours);
        std::unique_ptr<torch::optim::Optimizer> reference;
        if (options.kind == OptimizerKind::Sgd) {
            reference = std::make_unique<torch::optim::SGD>(
                theirs,
                torch::optim::SGDOptions(options.learningRate).momentum(options.momentum).weight_decay(weightDecay));
        } else if (options.kind == OptimizerKind::Adam) {
            reference = std::make_unique<torch::optim::Adam>(
                theirs, torch::optim::AdamOptions(options.learningRate).weight_decay(weightDecay));
        } else {
            reference = std::make_unique<torch::optim::AdamW>(
                theirs, torch::optim::AdamWOptions(options.learningRate).weight_decay(weightDecay));
        }
        torch::manual_seed(11);
        for (int step = 0; step < 6; ++step) {
            std::vector<torch::Tensor> grads;
            for (size_t i = 0; i < ours.size(); ++i) {
                grads.push_back(torch::randn_like(ours[i]));
                theirs[i].mutable_grad() = grads.back().clone();
            }
            optimizer.prepare();
            optimizer.apply(grads);
            reference->step();
        }
        const double difference = maxDifference(ours, theirs);
        QVERIFY2(difference <= 1e-6, qPrintable(QString::number(difference)));
        QCOMPARE(optimizer.stepCount(), qint64(6));
    }

    void stateBytesMatchPreparedState() {
        auto params = makeParameters();
        int64_t paramBytes = 0;
        for (const auto& p : params) paramBytes += p.numel() * 4;
        OptimizerOptions sgd;
        QCOMPARE(Optimizer(sgd, params).stateBytes(), qint64(paramBytes));
        sgd.momentum = 0;
        QCOMPARE(Optimizer(sgd, params).stateBytes(), qint64(0));
        OptimizerOptions adam;
        adam.kind = OptimizerKind::Adam;
        Optimizer optimizer(adam, params);
        QCOMPARE(optimizer.stateBytes(), qint64(2 * paramBytes));
        QVERIFY(!optimizer.stateReady());
        optimizer.prepare();
        QVERIFY(optimizer.stateReady());
        QCOMPARE(optimizer.firstState().size(), params.size());
        QCOMPARE(optimizer.secondState().size(), params.size());
    }

    void prepareChangesNoParameter() {
        auto params = makeParameters();
        const auto before = clones(params);
        OptimizerOptions adam;
        adam.kind = OptimizerKind::AdamW;
        adam.weightDecay = 0.1;
        Optimizer optimizer(adam, params);
        optimizer.prepare();
        QCOMPARE(maxDifference(params, before), 0.0);
    }
};

}  // namespace tst_optimizer

BATCHPILOT_TEST_MAIN(tst_optimizer::TestOptimizer)
#include "tst_optimizer.moc"
