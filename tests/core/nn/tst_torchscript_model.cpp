#include <QtTest>
#include "tests/test_main.h"

#include <fstream>

#include <torch/script.h>
#include <torch/torch.h>

#include "core/data/dataset.h"
#include "core/nn/model_factory.h"
#include "core/nn/torchscript_model.h"
#include "core/train/trainer.h"
#include "tests/core/recording_sink.h"

namespace tst_torchscript_model {

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;

namespace {

/// Small synthetic images, 1x4x4, 3 classes: 16 features for a linear TorchScript model.
DataOptions tinyData() {
    DataOptions options;
    options.samples = 512;
    options.channels = 1;
    options.height = 4;
    options.width = 4;
    options.classes = 3;
    return options;
}

constexpr const char* kLinearForward = R"(
def forward(self, x):
    return torch.matmul(x.flatten(1), self.w) + self.b
)";

/// A linear classifier `features -> outputs` saved as TorchScript, as Python's torch.jit.script
/// would save it (parameters that require gradients).
std::string saveLinear(const QTemporaryDir& dir, const char* name, int64_t features, int64_t outputs,
                       const char* forward = kLinearForward, bool trainable = true) {
    torch::jit::Module module("Net");
    module.register_parameter("w", (0.01 * torch::randn({features, outputs})).requires_grad_(trainable), false);
    module.register_parameter("b", torch::zeros({outputs}).requires_grad_(trainable), false);
    module.define(forward);
    const std::string path = dir.filePath(QString::fromLatin1(name)).toStdString();
    module.save(path);
    return path;
}

QString loadError(const std::string& path, const Dataset& data) {
    auto model = loadTorchScriptModel(path, data);
    if (model) return {};
    return QString::fromStdString(model.error());
}

}  // namespace

class TestTorchScriptModel : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void loadsAndRunsLikeTheModule() {
        QTemporaryDir dir;
        torch::manual_seed(0);
        const auto path = saveLinear(dir, "linear.pt", 16, 3);
        SyntheticImages data(tinyData());
        auto made = loadTorchScriptModel(path, data);
        QVERIFY2(made, made ? "" : made.error().c_str());
        Model& model = **made;
        QCOMPARE(QString::fromStdString(model.name()), QStringLiteral("TorchScript linear.pt"));
        const auto parameters = model.parameters();
        QCOMPARE(parameters.size(), size_t{2});
        QCOMPARE(model.parameterCount(), int64_t{16 * 3 + 3});
        QVERIFY(model.buffers().empty());
        QVERIFY(!model.usesBatchStatistics());
        const Batch batch = data.get({0, 1, 2, 3, 4});
        const auto out = model.forward(batch.inputs);
        QCOMPARE(out.sizes().vec(), (std::vector<int64_t>{5, 3}));
        const auto expected = torch::matmul(batch.inputs.flatten(1), parameters[0]) + parameters[1];
        QVERIFY(torch::allclose(out, expected));
        // Gradients reach the module's own parameters.
        torch::nn::functional::cross_entropy(out, batch.targets).backward();
        QVERIFY(parameters[0].grad().defined() && parameters[0].grad().abs().sum().item<float>() > 0);
    }

    void detectsBatchNormByTypeName() {
        QTemporaryDir dir;
        torch::jit::Module norm("BatchNorm2d");
        norm.register_buffer("running_mean", torch::zeros({1}));
        norm.define("def forward(self, x):\n    return x - self.running_mean\n");
        torch::jit::Module net("Net");
        net.register_parameter("w", torch::randn({16, 3}).requires_grad_(), false);
        net.register_module("bn", norm);
        net.define("def forward(self, x):\n    return torch.matmul(self.bn.forward(x).flatten(1), self.w)\n");
        const std::string path = dir.filePath(QStringLiteral("bn.pt")).toStdString();
        net.save(path);
        SyntheticImages data(tinyData());
        auto model = loadTorchScriptModel(path, data);
        QVERIFY2(model, model ? "" : model.error().c_str());
        QVERIFY((*model)->usesBatchStatistics());
        QCOMPARE((*model)->buffers().size(), size_t{1});
    }

    void badModelsAreClearErrors_data() {
        QTest::addColumn<QString>("kind");
        QTest::addColumn<QString>("message");
        QTest::newRow("missing") << QStringLiteral("missing") << QStringLiteral("does not exist");
        QTest::newRow("not torchscript") << QStringLiteral("garbage") << QStringLiteral("is not a TorchScript file");
        QTest::newRow("no parameters") << QStringLiteral("no-parameters")
                                       << QStringLiteral("has no trainable parameters: nothing to train");
        QTest::newRow("frozen") << QStringLiteral("frozen") << QStringLiteral("all 2 are frozen (requires_grad=False)");
        QTest::newRow("two arguments")
            << QStringLiteral("two-arguments")
            << QStringLiteral("forward(x, mask) takes 2 required arguments, but training passes exactly one");
        QTest::newRow("wrong classes")
            << QStringLiteral("wrong-classes")
            << QStringLiteral("returns [1, 5] for one sample; the data has 3 classes, so [1, 3] is expected");
        QTest::newRow("wrong input")
            << QStringLiteral("wrong-input")
            << QStringLiteral("fails on a sample of synthetic 1x4x4, 3 classes, 512 samples (input [1, 1, 4, 4])");
        QTest::newRow("tuple output") << QStringLiteral("tuple")
                                      << QStringLiteral("forward returns a Tuple, but training needs one Tensor");
        QTest::newRow("drops the batch") << QStringLiteral("no-batch")
                                         << QStringLiteral("returns [3] for a batch of 2 samples");
    }
    void badModelsAreClearErrors() {
        QFETCH(QString, kind);
        QFETCH(QString, message);
        QTemporaryDir dir;
        SyntheticImages data(tinyData());
        std::string path = dir.filePath(QStringLiteral("model.pt")).toStdString();
        if (kind == QLatin1String("garbage")) {
            std::ofstream(path, std::ios::binary) << "PK\x03\x04 not really a zip";
        } else if (kind == QLatin1String("no-parameters")) {
            torch::jit::Module module("Net");
            module.register_buffer("w", torch::randn({16, 3}));
            module.define("def forward(self, x):\n    return torch.matmul(x.flatten(1), self.w)\n");
            module.save(path);
        } else if (kind == QLatin1String("frozen")) {
            path = saveLinear(dir, "model.pt", 16, 3, kLinearForward, /*trainable=*/false);
        } else if (kind == QLatin1String("two-arguments")) {
            path = saveLinear(
                dir, "model.pt", 16, 3,
                "def forward(self, x, mask):\n    return torch.matmul(x.flatten(1) * mask, self.w) + self.b\n");
        } else if (kind == QLatin1String("wrong-classes")) {
            path = saveLinear(dir, "model.pt", 16, 5);
        } else if (kind == QLatin1String("wrong-input")) {
            path = saveLinear(dir, "model.pt", 784, 3);
        } else if (kind == QLatin1String("tuple")) {
            path = saveLinear(
                dir, "model.pt", 16, 3,
                "def forward(self, x):\n    y = torch.matmul(x.flatten(1), self.w) + self.b\n    return (y, y)\n");
        } else if (kind == QLatin1String("no-batch")) {
            path =
                saveLinear(dir, "model.pt", 16, 3,
                           "def forward(self, x):\n    return (torch.matmul(x.flatten(1), self.w) + self.b).sum(0)\n");
        }
        const QString error = loadError(path, data);
        QVERIFY2(error.contains(message), qPrintable(error));
        QVERIFY2(error.contains(QString::fromStdString(path)), qPrintable(error));
    }

    // A file whose pickle claims a larger storage than its zip record holds: LibTorch would size
    // the storage by the claim and read past the record's bytes in forward. The pickle is stored
    // uncompressed and LibTorch's zip reader skips record checksums, so one byte changes the
    // claim of w (16 x 3 = 48 floats) to 255 floats, as a damaged or crafted file would.
    void storageClaimingMoreThanItsRecordIsRefused() {
        QTemporaryDir dir;
        const auto path = saveLinear(dir, "model.pt", 16, 3);
        std::string bytes;
        {
            std::ifstream in(path, std::ios::binary);
            bytes.assign(std::istreambuf_iterator<char>(in), {});
        }
        // ('storage', FloatStorage, key, 'cpu', 48) ends with BININT1 48, TUPLE, BINPERSID.
        const std::string claim48{"K\x30tQ", 4};
        const size_t at = bytes.find(claim48);
        QVERIFY2(at != std::string::npos && bytes.find(claim48, at + 1) == std::string::npos,
                 "the pickle no longer stores w's storage as expected: update this test");
        bytes[at + 1] = '\xff';
        std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;

        SyntheticImages data(tinyData());
        const QString error = loadError(path, data);
        QVERIFY2(error.contains(QStringLiteral("is damaged or was altered: its tensor w claims 1020 bytes of data, but "
                                               "the file holds 192 for it")),
                 qPrintable(error));
        QVERIFY2(error.contains(QStringLiteral("load them only from a source you trust")), qPrintable(error));
    }

    void optionalArgumentsAreFine() {
        QTemporaryDir dir;
        const auto path = saveLinear(dir, "model.pt", 16, 3,
                                     "def forward(self, x, scale: float = 1.0):\n"
                                     "    return (torch.matmul(x.flatten(1), self.w) + self.b) * scale\n");
        SyntheticImages data(tinyData());
        QCOMPARE(loadError(path, data), QString());
    }

    void makeModelDispatches() {
        QTemporaryDir dir;
        SyntheticImages data(tinyData());
        ModelOptions options;
        options.name = "mlp";
        options.width = 8;
        auto builtin = makeModel(options, data);
        QVERIFY(builtin);
        QCOMPARE(QString::fromStdString((*builtin)->name()), QStringLiteral("mlp"));

        options.name = saveLinear(dir, "net.pth", 16, 3);
        auto scripted = makeModel(options, data);
        QVERIFY2(scripted, scripted ? "" : scripted.error().c_str());
        QCOMPARE(QString::fromStdString((*scripted)->name()), QStringLiteral("TorchScript net.pth"));

        // An existing file without the usual extension is a model file too.
        std::filesystem::copy_file(options.name, dir.filePath(QStringLiteral("exported")).toStdString());
        options.name = dir.filePath(QStringLiteral("exported")).toStdString();
        QVERIFY(isModelFile(options.name));
        QVERIFY(makeModel(options, data));

        options.name = "absent.pt";
        auto missing = makeModel(options, data);
        QVERIFY(!missing);
        QCOMPARE(QString::fromStdString(missing.error()), QStringLiteral("model file absent.pt does not exist"));

        options.name = "gpt5";
        auto unknown = makeModel(options, data);
        QVERIFY(!unknown);
        QVERIFY2(QString::fromStdString(unknown.error())
                     .contains(QStringLiteral(
                         "unknown model \"gpt5\": choose mlp, cnn or resnet, or give a TorchScript file")),
                 unknown.error().c_str());
        QVERIFY(!isModelFile("cnn"));
    }

    void trainsThroughTheTrainer() {
        QTemporaryDir dir;
        torch::manual_seed(1);
        const auto path = saveLinear(dir, "linear.pt", 16, 3);
        TrainerOptions o;
        o.data = tinyData();
        o.model.name = path;
        o.device = "virtual:64MiB";
        o.targetBatch = 64;
        o.probe.maxMicroBatch = 16;  // four micro-batches per step: accumulation with a TorchScript model
        o.steps = 25;
        o.optimizer.kind = OptimizerKind::Adam;
        o.optimizer.learningRate = 0.05;
        o.modelFactory = [model = o.model](const Dataset& data) { return makeModel(model, data); };
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QVERIFY2(result.state == RunState::Finished, qPrintable(QString::fromStdString(result.error)));
        QCOMPARE(result.steps, int64_t{25});
        const auto steps = sink.all<StepMetrics>();
        QCOMPARE(steps.size(), size_t{25});
        QVERIFY(steps.front().microBatch <= 16 && steps.front().accumulationSteps >= 4);
        const double first = (steps[0].loss + steps[1].loss + steps[2].loss) / 3;
        const double last = (steps[22].loss + steps[23].loss + steps[24].loss) / 3;
        QVERIFY2(last < 0.5 * first, qPrintable(QStringLiteral("loss %1 → %2").arg(first).arg(last)));
    }

    void badModelFailsTheRunWithItsMessage() {
        QTemporaryDir dir;
        const auto path = saveLinear(dir, "five.pt", 16, 5);
        TrainerOptions o;
        o.data = tinyData();
        o.model.name = path;
        o.steps = 1;
        o.modelFactory = [model = o.model](const Dataset& data) { return makeModel(model, data); };
        RecordingSink sink;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Failed);
        QVERIFY2(QString::fromStdString(result.error).contains(QStringLiteral("the data has 3 classes")),
                 result.error.c_str());
    }
};

}  // namespace tst_torchscript_model

BATCHPILOT_TEST_MAIN(tst_torchscript_model::TestTorchScriptModel)
#include "tst_torchscript_model.moc"
