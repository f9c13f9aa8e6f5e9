#include <QtTest>
#include "tests/test_main.h"

#include <cmath>
#include <stdexcept>

#include <torch/torch.h>

#include "core/nn/loss.h"
#include "core/config/options.h"

Q_DECLARE_METATYPE(torch::Tensor)

namespace tst_loss {

using namespace batchpilot::core;

namespace {

QString thrownMessage(LossKind kind, const torch::Tensor& output, const torch::Tensor& target) {
    try {
        computeLoss(kind, output, target);
    } catch (const std::invalid_argument& error) {
        return QString::fromStdString(error.what());
    }
    return {};
}

}  // namespace

class TestLoss : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void crossEntropyValues() {
        // Uniform logits over 4 classes: log(4) whatever the labels.
        const auto uniform =
            computeLoss(LossKind::CrossEntropy, torch::zeros({2, 4}), torch::tensor({0, 3}, torch::kInt64));
        QVERIFY(std::abs(uniform.item<double>() - std::log(4.0)) < 1e-6);
        // Against a hand computation on one sample: -log softmax([1, 2, 3])[2].
        const auto logits = torch::tensor({{1.0F, 2.0F, 3.0F}});
        const double expected = -std::log(std::exp(3.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0)));
        QVERIFY(std::abs(computeLoss(LossKind::CrossEntropy, logits, torch::tensor({2}, torch::kInt64)).item<double>() -
                         expected) < 1e-6);
    }

    void mseValuesAndShapes() {
        const auto output = torch::tensor({{1.0F}, {3.0F}});
        const auto target = torch::tensor({{0.0F}, {1.0F}});
        QCOMPARE(computeLoss(LossKind::Mse, output, target).item<float>(), 2.5F);  // (1 + 4) / 2
        // A [N] output against the CSV loader's [N, 1] targets.
        QCOMPARE(computeLoss(LossKind::Mse, torch::tensor({1.0F, 3.0F}), target).item<float>(), 2.5F);
        // Class ids are one-hot encoded: a perfect one-hot output has zero loss.
        const auto oneHot = torch::tensor({{1.0F, 0.0F, 0.0F}, {0.0F, 0.0F, 1.0F}});
        QCOMPARE(computeLoss(LossKind::Mse, oneHot, torch::tensor({0, 2}, torch::kInt64)).item<float>(), 0.0F);
        QCOMPARE(computeLoss(LossKind::Mse, torch::zeros({2, 3}), torch::tensor({0, 2}, torch::kInt64)).item<float>(),
                 2.0F / 6.0F);
    }

    void gradientsFlow_data() {
        QTest::addColumn<int>("kind");
        QTest::newRow("cross-entropy") << int(LossKind::CrossEntropy);
        QTest::newRow("mse") << int(LossKind::Mse);
    }
    void gradientsFlow() {
        QFETCH(int, kind);
        auto output = torch::randn({4, 3}, torch::requires_grad());
        const auto loss = computeLoss(static_cast<LossKind>(kind), output, torch::tensor({0, 1, 2, 1}, torch::kInt64));
        QCOMPARE(loss.dim(), int64_t{0});
        loss.backward();
        QVERIFY(output.grad().defined());
        QVERIFY(output.grad().abs().sum().item<float>() > 0);
    }

    void mismatchesAreClearErrors_data() {
        QTest::addColumn<int>("kind");
        QTest::addColumn<torch::Tensor>("output");
        QTest::addColumn<torch::Tensor>("target");
        QTest::addColumn<QString>("message");
        QTest::newRow("regression targets with cross-entropy")
            << int(LossKind::CrossEntropy) << torch::zeros({4, 1}) << torch::zeros({4, 2})
            << QStringLiteral(
                   "cross-entropy needs class ids, but the targets are float values [4, 2] (regression data): use the "
                   "mse loss");
        QTest::newRow("one output per sample with cross-entropy")
            << int(LossKind::CrossEntropy) << torch::zeros({4}) << torch::zeros({4}, torch::kInt64)
            << QStringLiteral("the model gave [4] for targets [4]");
        QTest::newRow("mse shape") << int(LossKind::Mse) << torch::zeros({4, 3}) << torch::zeros({4, 1})
                                   << QStringLiteral(
                                          "mse needs outputs of the targets' shape [4, 1]; the model gave [4, 3]");
        QTest::newRow("mse class ids") << int(LossKind::Mse) << torch::zeros({4}) << torch::zeros({4}, torch::kInt64)
                                       << QStringLiteral("mse with class-id targets [4] needs outputs [N, classes]");
    }
    void mismatchesAreClearErrors() {
        QFETCH(int, kind);
        QFETCH(torch::Tensor, output);
        QFETCH(torch::Tensor, target);
        QFETCH(QString, message);
        const QString error = thrownMessage(static_cast<LossKind>(kind), output, target);
        QVERIFY2(error.contains(message), qPrintable(error));
    }

    void namesRoundTrip() {
        for (LossKind kind : {LossKind::CrossEntropy, LossKind::Mse}) {
            const auto parsed = parseLossKind(toString(kind));
            QVERIFY(parsed);
            QCOMPARE(*parsed, kind);
        }
        QCOMPARE(*parseLossKind("CE"), LossKind::CrossEntropy);
        QCOMPARE(*parseLossKind("MSE"), LossKind::Mse);
        const auto bad = parseLossKind("hinge");
        QVERIFY(!bad);
        QCOMPARE(QString::fromStdString(bad.error()),
                 QStringLiteral("unknown loss \"hinge\": choose cross-entropy (classification) or mse (regression)"));
        QCOMPARE(TrainerOptions{}.loss, LossKind::CrossEntropy);
    }
};

}  // namespace tst_loss

BATCHPILOT_TEST_MAIN(tst_loss::TestLoss)
#include "tst_loss.moc"
