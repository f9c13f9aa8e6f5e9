// Activation checkpointing (core/nn/activation_checkpoint.h, issue 15): the gradients of a model run
// in checkpointed segments against the same model run plainly, BatchNorm's running statistics
// updated once, dropout recomputed with the same random numbers, and the memory it saves,
// measured by the counting allocator.

#include <QtTest>
#include "tests/test_main.h"

#include <torch/torch.h>

#include "core/nn/activation_checkpoint.h"
#include "core/device/counting_allocator.h"

namespace tst_activation_checkpoint {

using namespace batchpilot::core;

namespace {

enum class Norm { Batch, Group, None };

/// A stack of blocks of `layers` x (conv, norm, ReLU), each block a segment, then a linear head.
/// Built from `seed`, so two built alike start alike.
struct Blocks {
    std::vector<torch::nn::Sequential> blocks;
    torch::nn::Linear head{nullptr};

    Blocks(int count, int64_t channels, Norm norm, double dropout, uint64_t seed, int layers = 1) {
        torch::manual_seed(seed);
        int64_t in = 3;
        for (int i = 0; i < count; ++i) {
            torch::nn::Sequential block;
            for (int l = 0; l < layers; ++l) {
                block->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, channels, 3).padding(1)));
                if (norm == Norm::Batch) block->push_back(torch::nn::BatchNorm2d(channels));
                if (norm == Norm::Group) block->push_back(torch::nn::GroupNorm(4, channels));
                block->push_back(torch::nn::ReLU());
                if (dropout > 0) block->push_back(torch::nn::Dropout(dropout));
                in = channels;
            }
            blocks.push_back(block);
        }
        head = torch::nn::Linear(channels, 5);
    }

    torch::Tensor forward(const torch::Tensor& x, bool checkpointing) {
        torch::Tensor h = x;
        for (auto& block : blocks) {
            if (checkpointing) {
                h = checkpointed([block](const torch::Tensor& in) mutable { return block->forward(in); }, h,
                                 block->parameters(), block->buffers());
            } else {
                h = block->forward(h);
            }
        }
        return head->forward(h.mean({2, 3}));
    }

    std::vector<torch::Tensor> parameters() const {
        std::vector<torch::Tensor> all;
        for (const auto& block : blocks)
            for (const auto& p : block->parameters()) all.push_back(p);
        for (const auto& p : head->parameters()) all.push_back(p);
        return all;
    }
    std::vector<torch::Tensor> buffers() const {
        std::vector<torch::Tensor> all;
        for (const auto& block : blocks)
            for (const auto& b : block->buffers()) all.push_back(b);
        return all;
    }
};

/// Largest difference relative to the larger magnitude (at least 1).
double relativeDifference(const torch::Tensor& a, const torch::Tensor& b) {
    const double scale = std::max(1.0, std::max(a.abs().max().item<double>(), b.abs().max().item<double>()));
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / scale;
}

/// One forward and backward pass of `model` on a fixed batch; the loss.
double trainStep(Blocks& model, bool checkpointing, const torch::Tensor& inputs, const torch::Tensor& targets) {
    for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
    const torch::Tensor loss = torch::nn::functional::cross_entropy(model.forward(inputs, checkpointing), targets);
    loss.backward();
    return loss.item<double>();
}

}  // namespace

class TestActivationCheckpoint : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase() { installCountingAllocator(); }

    void gradientsEqualPlainRun_data() {
        QTest::addColumn<int>("norm");
        QTest::addColumn<double>("dropout");
        QTest::newRow("conv, BatchNorm") << int(Norm::Batch) << 0.0;
        QTest::newRow("conv, GroupNorm") << int(Norm::Group) << 0.0;
        // The recomputation draws the dropout masks of the first pass again.
        QTest::newRow("conv, dropout") << int(Norm::None) << 0.3;
    }
    /// The same weights, the same batch: the loss, every parameter's gradient (≤ 1e-6 relative)
    /// and the running statistics after the step match the plain run, and the random numbers
    /// training draws next are the same.
    void gradientsEqualPlainRun() {
        QFETCH(int, norm);
        QFETCH(double, dropout);
        torch::manual_seed(7);
        const torch::Tensor inputs = torch::randn({6, 3, 12, 12});
        const torch::Tensor targets = torch::randint(0, 5, {6});
        Blocks plain(4, 16, Norm(norm), dropout, 11, 2);
        Blocks checkpointing(4, 16, Norm(norm), dropout, 11, 2);

        torch::manual_seed(3);
        const double plainLoss = trainStep(plain, false, inputs, targets);
        const double plainNext = torch::rand({1}).item<double>();
        torch::manual_seed(3);
        const double loss = trainStep(checkpointing, true, inputs, targets);
        const double next = torch::rand({1}).item<double>();

        QCOMPARE(loss, plainLoss);
        QCOMPARE(next, plainNext);
        const auto a = plain.parameters();
        const auto b = checkpointing.parameters();
        QCOMPARE(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) {
            QVERIFY2(b[i].grad().defined(), qPrintable(QStringLiteral("parameter %1 has no gradient").arg(i)));
            const double difference = relativeDifference(a[i].grad(), b[i].grad());
            QVERIFY2(difference <= 1e-6, qPrintable(QStringLiteral("parameter %1: %2").arg(i).arg(difference)));
            QVERIFY(a[i].grad().abs().sum().item<double>() > 0);  // a gradient that says something
        }
        // BatchNorm's running statistics and batch counter: updated once, as in the plain run.
        const auto x = plain.buffers();
        const auto y = checkpointing.buffers();
        QCOMPARE(x.size(), y.size());
        for (size_t i = 0; i < x.size(); ++i) QVERIFY(torch::equal(x[i], y[i]));
        if (Norm(norm) == Norm::Batch) {
            QVERIFY(!x.empty());
            QCOMPARE(y.back().item<int64_t>(), int64_t{1});  // num_batches_tracked of the last block
        }
    }

    /// A segment whose input needs a gradient passes it on (here the input itself is trained).
    void inputGradientFlows() {
        Blocks plain(2, 8, Norm::Group, 0.0, 5);
        Blocks checkpointing(2, 8, Norm::Group, 0.0, 5);
        torch::manual_seed(1);
        const torch::Tensor x = torch::randn({2, 3, 8, 8});
        torch::Tensor a = x.clone().requires_grad_(true);
        torch::Tensor b = x.clone().requires_grad_(true);
        plain.forward(a, false).sum().backward();
        checkpointing.forward(b, true).sum().backward();
        QVERIFY(b.grad().defined());
        QVERIFY(relativeDifference(a.grad(), b.grad()) <= 1e-6);
    }

    /// A segment runs once forward and once more in backward, never more; without grad mode
    /// (evaluation, validation) only once, and nothing is kept.
    void recomputesOncePerBackward() {
        torch::manual_seed(2);
        torch::nn::Linear layer(4, 3);
        int calls = 0;
        const Segment segment = [&](const torch::Tensor& x) {
            ++calls;
            return torch::relu(layer->forward(x));
        };
        const torch::Tensor x = torch::randn({5, 4});
        {
            torch::NoGradGuard noGrad;
            const torch::Tensor out = checkpointed(segment, x, layer->parameters());
            QCOMPARE(calls, 1);
            QVERIFY(!out.requires_grad());
        }
        calls = 0;
        const torch::Tensor out = checkpointed(segment, x, layer->parameters());
        QCOMPARE(calls, 1);
        QVERIFY(out.requires_grad());
        out.sum().backward();
        QCOMPARE(calls, 2);
        QVERIFY(layer->weight.grad().defined());
    }

    /// The point of it: 8 blocks of two conv layers, 32 channels at 32x32, keep each block's input
    /// and one block's activations instead of every layer's. Peak memory of a forward and
    /// backward pass, counted by the allocator, for both.
    void keepsLessMemory() {
        Blocks plain(8, 32, Norm::Batch, 0.0, 2, 2);
        Blocks checkpointing(8, 32, Norm::Batch, 0.0, 2, 2);
        torch::manual_seed(4);
        const torch::Tensor inputs = torch::randn({8, 3, 32, 32});
        const torch::Tensor targets = torch::randint(0, 5, {8});
        const auto peakOf = [&](Blocks& model, bool on) {
            CountingScope counting(true);
            CountingAllocator& allocator = CountingAllocator::instance();
            allocator.resetPeak();
            const int64_t before = allocator.allocated();
            trainStep(model, on, inputs, targets);
            return allocator.peak() - before;
        };
        const int64_t plainPeak = peakOf(plain, false);
        const int64_t peak = peakOf(checkpointing, true);
        // A layer's output is 8x32x32x32 floats, 1 MiB. The plain run keeps each layer's conv and
        // ReLU outputs for backward, 2 MiB a layer, 32 MiB for 16 layers; the checkpointed one
        // keeps the 8 blocks' inputs, 1 MiB each, and recomputes one block (4 MiB) at a time.
        qInfo("peak of a training step: %.1f MiB plain, %.1f MiB checkpointed", plainPeak / 1048576.0,
              peak / 1048576.0);
        QVERIFY2(peak < 0.7 * plainPeak, qPrintable(QStringLiteral("%1 vs %2").arg(peak).arg(plainPeak)));
    }
};

}  // namespace tst_activation_checkpoint

BATCHPILOT_TEST_MAIN(tst_activation_checkpoint::TestActivationCheckpoint)
#include "tst_activation_checkpoint.moc"
