#include <QtTest>
#include "tests/test_main.h"

#include <QTemporaryDir>

#include "core/config/run_config.h"

namespace tst_run_config {

using namespace batchpilot::core;
using nlohmann::json;

class TestRunConfig : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void readsEveryKey() {
        const json config = json::parse(R"({
          "model": {"name": "resnet", "norm": "batch", "width": 16},
          "data": {"name": "synthetic", "samples": 1000, "image_size": [3, 224, 224], "classes": 5, "seed": 7},
          "device": "virtual:2GiB",
          "target_batch": 4096,
          "probe": {"initial_micro_batch": 4, "max_micro_batch": 512, "headroom": 0.1, "multiple_of": 8,
                    "max_trials": 30, "tolerance": 0.01, "objective": "largest"},
          "optimizer": {"kind": "adamw", "learning_rate": 0.001, "momentum": 0.5, "weight_decay": 0.01,
                        "beta1": 0.8, "beta2": 0.99, "epsilon": 1e-6},
          "steps": 200, "epochs": 0, "seed": 3, "lr_scaling": "sqrt", "regrow_after_steps": 5, "threads": 2
        })");
        const auto o = parseRunConfig(config);
        QVERIFY2(o.has_value(), o ? "" : o.error().c_str());
        QCOMPARE(o->model.name, std::string("resnet"));
        QCOMPARE(o->model.norm, NormKind::Batch);
        QCOMPARE(o->data.height, qint64(224));
        QCOMPARE(o->data.classes, qint64(5));
        QCOMPARE(o->device, std::string("virtual:2GiB"));
        QCOMPARE(o->targetBatch, qint64(4096));
        QCOMPARE(o->probe.multipleOf, qint64(8));
        QCOMPARE(o->probe.headroom, 0.1);
        QCOMPARE(o->probe.objective, ProbeObjective::Largest);
        QCOMPARE(o->optimizer.kind, OptimizerKind::AdamW);
        QCOMPARE(o->optimizer.beta2, 0.99);
        QCOMPARE(o->lrScaling, LrScaling::Sqrt);
        QCOMPARE(o->regrowAfterSteps, 5);
        QCOMPARE(o->intraOpThreads, 2);
        // Round trip: what is written reads back the same.
        const auto again = parseRunConfig(toRunConfig(*o));
        QVERIFY(again.has_value());
        QCOMPARE(toRunConfig(*again), toRunConfig(*o));
    }

    void missingKeysKeepBase() {
        TrainerOptions base;
        base.targetBatch = 77;
        base.device = "virtual:64MiB";
        const auto o = parseRunConfig(json::parse(R"({"steps": 5})"), base);
        QVERIFY(o.has_value());
        QCOMPARE(o->targetBatch, qint64(77));
        QCOMPARE(o->device, std::string("virtual:64MiB"));
        QCOMPARE(o->steps, qint64(5));
    }

    /// How steps and epochs combine, as the CLI's --steps/--epochs do (core::setEpochs).
    void runLength_data() {
        QTest::addColumn<QString>("config");
        QTest::addColumn<qint64>("steps");   // -1: no step limit
        QTest::addColumn<qint64>("epochs");  // -1: no epoch limit
        QTest::newRow("neither: the default steps") << QStringLiteral("{}") << qint64(kDefaultSteps) << qint64(-1);
        QTest::newRow("epochs alone: no step limit") << QStringLiteral(R"({"epochs": 3})") << qint64(-1) << qint64(3);
        QTest::newRow("both: whichever first")
            << QStringLiteral(R"({"steps": 7, "epochs": 3})") << qint64(7) << qint64(3);
        QTest::newRow("null steps: until stopped") << QStringLiteral(R"({"steps": null})") << qint64(-1) << qint64(-1);
        QTest::newRow("0 from older files: as if absent")
            << QStringLiteral(R"({"steps": 0, "epochs": 0})") << qint64(kDefaultSteps) << qint64(-1);
        QTest::newRow("steps 0 with epochs")
            << QStringLiteral(R"({"steps": 0, "epochs": 2})") << qint64(-1) << qint64(2);
    }
    void runLength() {
        QFETCH(QString, config);
        QFETCH(qint64, steps);
        QFETCH(qint64, epochs);
        const auto o = parseRunConfig(json::parse(config.toStdString()));
        QVERIFY2(o.has_value(), o ? "" : o.error().c_str());
        QCOMPARE(o->steps.value_or(-1), steps);
        QCOMPARE(o->epochs.value_or(-1), epochs);
        // null survives a round trip (an unlimited GUI run saved and loaded stays unlimited).
        const auto again = parseRunConfig(toRunConfig(*o));
        QVERIFY(again.has_value());
        QCOMPARE(again->steps, o->steps);
        QCOMPARE(again->epochs, o->epochs);
    }

    /// resolve(): the one place the CLI, the configuration file and the GUI settle options.
    void resolveSettlesAndNamesTheField_data() {
        QTest::addColumn<QString>("config");
        QTest::addColumn<QString>("field");  // empty: resolves
        QTest::addColumn<QString>("message");
        QTest::newRow("unknown model")
            << QStringLiteral(R"({"model": {"name": "gpt"}})") << QStringLiteral("model.name")
            << QStringLiteral("unknown model \"gpt\": choose mlp, cnn or resnet, or give a TorchScript file");
        QTest::newRow("missing model file")
            << QStringLiteral(R"({"model": {"name": "no-such.pt"}})") << QStringLiteral("model.name")
            << QStringLiteral("model file no-such.pt does not exist");
        QTest::newRow("unknown dataset") << QStringLiteral(R"({"data": {"name": "imagenet"}})")
                                         << QStringLiteral("data.name")
                                         << QStringLiteral("choose synthetic, mnist, image-folder or csv");
        QTest::newRow("folder dataset without path")
            << QStringLiteral(R"({"data": {"name": "image-folder"}})") << QStringLiteral("data.path")
            << QStringLiteral("needs a data path (the folder to read)");
        QTest::newRow("max below initial")
            << QStringLiteral(R"({"probe": {"initial_micro_batch": 64, "max_micro_batch": 8}})")
            << QStringLiteral("probe.max_micro_batch") << QStringLiteral("is below the initial micro-batch 64");
        QTest::newRow("valid") << QStringLiteral(R"({"model": {"name": "mlp"}, "device": "virtual:64MiB"})")
                               << QString() << QString();
    }
    void resolveSettlesAndNamesTheField() {
        QFETCH(QString, config);
        QFETCH(QString, field);
        QFETCH(QString, message);
        // The configuration reader checks ranges only: names and paths are resolve()'s.
        const auto read = parseRunConfig(json::parse(config.toStdString()));
        QVERIFY2(read.has_value() || !field.isEmpty(), read ? "" : read.error().c_str());
        const auto resolved = resolve(read.value_or(TrainerOptions{}));
        if (field.isEmpty()) {
            QVERIFY2(resolved.has_value(), resolved ? "" : resolved.error().message.c_str());
            return;
        }
        if (!read) {  // refused already while reading (a range): the same rule, one message
            QVERIFY2(QString::fromStdString(read.error()).contains(message), read.error().c_str());
            return;
        }
        QVERIFY(!resolved.has_value());
        QCOMPARE(QString::fromStdString(resolved.error().field), field);
        QVERIFY2(QString::fromStdString(resolved.error().message).contains(message), resolved.error().message.c_str());
    }

    void csvWithMseIsRegression() {
        QTemporaryDir dir;
        const QString csv = dir.filePath(QStringLiteral("t.csv"));
        QFile file(csv);
        QVERIFY(file.open(QIODevice::WriteOnly));
        file.write("x,y\n1,2\n");
        file.close();
        TrainerOptions o;
        o.data.name = "csv";
        o.data.path = csv.toStdString();
        o.loss = LossKind::Mse;
        QVERIFY(!o.data.regression);
        const auto resolved = resolve(o);
        QVERIFY2(resolved.has_value(), resolved ? "" : resolved.error().message.c_str());
        QVERIFY(resolved->data.regression);
        o.loss = LossKind::CrossEntropy;
        QVERIFY(!resolve(o)->data.regression);
    }

    void errorsNameTheKeyPath_data() {
        QTest::addColumn<QString>("config");
        QTest::addColumn<QString>("message");
        QTest::newRow("unknown key") << QStringLiteral(R"({"probe": {"headrom": 0.1}})")
                                     << QStringLiteral(
                                            "probe.headrom: unknown key; known keys here: check_seconds, headroom");
        QTest::newRow("a section's key as one dotted key")
            << QStringLiteral(R"({"probe.headroom": 0.5})") << QStringLiteral("probe.headroom: unknown key");
        QTest::newRow("wrong type") << QStringLiteral(R"({"target_batch": "big"})")
                                    << QStringLiteral("target_batch: expected an integer, got a string \"big\"");
        QTest::newRow("fraction as integer type")
            << QStringLiteral(R"({"target_batch": 12.5})")
            << QStringLiteral("target_batch: expected an integer, got a number 12.5");
        QTest::newRow("out of range") << QStringLiteral(R"({"probe": {"headroom": 1.5}})")
                                      << QStringLiteral("probe.headroom: expected a number in [0, 0.9], got 1.5");
        QTest::newRow("zero target") << QStringLiteral(R"({"target_batch": 0})")
                                     << QStringLiteral("target_batch: expected an integer from 1 to 2147483648, got 0");
        QTest::newRow("bad device") << QStringLiteral(R"({"device": "virtual:lots"})")
                                    << QStringLiteral(
                                           "device: device \"virtual:lots\": \"lots\" is neither a memory "
                                           "size (e.g. virtual:512MiB) nor a GPU preset");
        QTest::newRow("bad memory savers")
            << QStringLiteral(R"({"memory_savers": "fp8"})")
            << QStringLiteral(
                   "memory_savers: unknown memory savers \"fp8\": choose auto, checkpoint, bf16, both, fp16, "
                   "checkpoint-fp16 or off");
        QTest::newRow("loss scale below 1") << QStringLiteral(R"({"loss_scale": 0.5})")
                                            << QStringLiteral("loss_scale: expected a number in [1, 1e+30], got 0.5");
        QTest::newRow("bad objective") << QStringLiteral(R"({"probe": {"objective": "quickest"}})")
                                       << QStringLiteral("probe.objective: unknown probe objective \"quickest\"");
        QTest::newRow("zero drift") << QStringLiteral(R"({"probe": {"retime_drift": 0}})")
                                    << QStringLiteral("probe.retime_drift: expected a number in [0.01, 10], got 0");
        QTest::newRow("negative re-timing")
            << QStringLiteral(R"({"probe": {"retime_every": -3}})")
            << QStringLiteral("probe.retime_every: expected an integer from 0 to 1000000, got -3");
        QTest::newRow("bad optimizer") << QStringLiteral(R"({"optimizer": {"kind": "lion"}})")
                                       << QStringLiteral("optimizer.kind: unknown optimizer \"lion\"");
        QTest::newRow("image size shape") << QStringLiteral(R"({"data": {"image_size": [32, 32]}})")
                                          << QStringLiteral("data.image_size: expected [channels, height, width]");
        QTest::newRow("image size element") << QStringLiteral(R"({"data": {"image_size": [3, 0, 32]}})")
                                            << QStringLiteral("data.image_size[1]: expected an integer from 1");
        QTest::newRow("not an object") << QStringLiteral(R"([1, 2])")
                                       << QStringLiteral("configuration: expected an object");
        QTest::newRow("keep best by an unknown metric") << QStringLiteral(R"({"checkpoint": {"keep_best": "val_f1"}})")
                                                        << QStringLiteral("unknown validation metric \"val_f1\"");
        // MSE on class ids (one-hot targets) still measures accuracy, not MAE.
        QTest::newRow("keep best by MAE of class ids")
            << QStringLiteral(R"({"loss": "mse", "checkpoint": {"keep_best": "val_mae"}})")
            << QStringLiteral("val_mae is measured for regression data only");
        QTest::newRow("momentum open range") << QStringLiteral(R"({"optimizer": {"momentum": 1.0}})")
                                             << QStringLiteral("optimizer.momentum: expected a number in [0, 1)");
    }
    void errorsNameTheKeyPath() {
        QFETCH(QString, config);
        QFETCH(QString, message);
        const auto o = parseRunConfig(json::parse(config.toStdString()));
        QVERIFY(!o.has_value());
        QVERIFY2(QString::fromStdString(o.error()).contains(message), o.error().c_str());
    }

    /// Every field a configuration file holds comes back as it was written, each set to a value
    /// other than its default (so a field the writer forgets would come back as the default).
    void everyFieldRoundTrips() {
        TrainerOptions o;
        o.model.name = "resnet";
        o.model.norm = NormKind::Batch;
        o.model.width = 24;
        o.data.name = "csv";
        o.data.samples = 777;
        o.data.classes = 7;
        o.data.seed = 99;
        o.data.channels = 1;
        o.data.height = 20;
        o.data.width = 28;
        o.data.path = "table.csv";
        o.data.targetColumn = "label";
        o.data.regression = true;
        o.device = "virtual:96MiB";
        o.targetBatch = 333;
        o.probe.initialMicroBatch = 5;
        o.probe.maxMicroBatch = 200;
        o.probe.headroom = 0.125;
        o.probe.multipleOf = 8;
        o.probe.maxTrials = 11;
        o.probe.tolerance = 0.25;
        o.probe.objective = ProbeObjective::Largest;  // not the default
        o.probe.retimeEvery = 7;
        o.probe.retimeDrift = 0.25;
        o.probe.checkSeconds = 7.5;
        o.optimizer.kind = OptimizerKind::AdamW;
        o.optimizer.learningRate = 0.00375;
        o.optimizer.momentum = 0.5;
        o.optimizer.weightDecay = 0.0625;
        o.optimizer.beta1 = 0.8;
        o.optimizer.beta2 = 0.99;
        o.optimizer.epsilon = 1e-6;
        o.steps = 17;
        o.epochs = 3;
        o.seed = 12345;
        o.lrScaling = LrScaling::Sqrt;
        o.loss = LossKind::Mse;
        o.memorySavers = MemorySavers::CheckpointFp16;  // not the default
        o.saverThreshold = 9;
        o.lossScale = 1024;
        o.regrowAfterSteps = 9;
        o.intraOpThreads = 3;
        o.cudaMemoryFraction = 0.5;
        o.checkpoint.directory = "ckpt";
        o.checkpoint.everySteps = 4;
        o.checkpoint.keepBest = "val_mae";  // a regression's (loss MSE above)

        QTemporaryDir dir;
        const std::string path = dir.filePath(QStringLiteral("all.json")).toStdString();
        QVERIFY(saveRunConfig(path, o).has_value());
        const auto loaded = loadRunConfig(path);
        QVERIFY2(loaded.has_value(), loaded ? "" : loaded.error().c_str());
        const TrainerOptions& r = *loaded;
        QCOMPARE(r.model.name, o.model.name);
        QCOMPARE(r.model.norm, o.model.norm);
        QCOMPARE(r.model.width, o.model.width);
        QCOMPARE(r.data.name, o.data.name);
        QCOMPARE(r.data.samples, o.data.samples);
        QCOMPARE(r.data.classes, o.data.classes);
        QCOMPARE(r.data.seed, o.data.seed);
        QCOMPARE(r.data.channels, o.data.channels);
        QCOMPARE(r.data.height, o.data.height);
        QCOMPARE(r.data.width, o.data.width);
        QCOMPARE(r.data.path, o.data.path);
        QCOMPARE(r.data.targetColumn, o.data.targetColumn);
        QCOMPARE(r.data.regression, o.data.regression);
        QCOMPARE(r.device, o.device);
        QCOMPARE(r.targetBatch, o.targetBatch);
        QCOMPARE(r.probe.initialMicroBatch, o.probe.initialMicroBatch);
        QCOMPARE(r.probe.maxMicroBatch, o.probe.maxMicroBatch);
        QCOMPARE(r.probe.headroom, o.probe.headroom);
        QCOMPARE(r.probe.multipleOf, o.probe.multipleOf);
        QCOMPARE(r.probe.maxTrials, o.probe.maxTrials);
        QCOMPARE(r.probe.tolerance, o.probe.tolerance);
        QCOMPARE(r.probe.objective, o.probe.objective);
        QCOMPARE(r.probe.retimeEvery, o.probe.retimeEvery);
        QCOMPARE(r.probe.retimeDrift, o.probe.retimeDrift);
        QCOMPARE(r.probe.checkSeconds, o.probe.checkSeconds);
        QCOMPARE(r.optimizer.kind, o.optimizer.kind);
        QCOMPARE(r.optimizer.learningRate, o.optimizer.learningRate);
        QCOMPARE(r.optimizer.momentum, o.optimizer.momentum);
        QCOMPARE(r.optimizer.weightDecay, o.optimizer.weightDecay);
        QCOMPARE(r.optimizer.beta1, o.optimizer.beta1);
        QCOMPARE(r.optimizer.beta2, o.optimizer.beta2);
        QCOMPARE(r.optimizer.epsilon, o.optimizer.epsilon);
        QCOMPARE(r.steps, o.steps);
        QCOMPARE(r.epochs, o.epochs);
        QCOMPARE(r.seed, o.seed);
        QCOMPARE(r.lrScaling, o.lrScaling);
        QCOMPARE(r.loss, o.loss);
        QCOMPARE(r.memorySavers, o.memorySavers);
        QCOMPARE(r.saverThreshold, o.saverThreshold);
        QCOMPARE(r.lossScale, o.lossScale);
        QCOMPARE(r.regrowAfterSteps, o.regrowAfterSteps);
        QCOMPARE(r.intraOpThreads, o.intraOpThreads);
        QCOMPARE(r.cudaMemoryFraction, o.cudaMemoryFraction);
        QCOMPARE(r.checkpoint.directory, o.checkpoint.directory);
        QCOMPARE(r.checkpoint.everySteps, o.checkpoint.everySteps);
        QCOMPARE(r.checkpoint.keepBest, o.checkpoint.keepBest);
    }

    void filesRoundTripAndReportProblems() {
        QTemporaryDir dir;
        const std::string path = dir.filePath(QStringLiteral("run.json")).toStdString();
        TrainerOptions o;
        o.targetBatch = 2048;
        o.device = "virtual:512MiB";
        o.optimizer.kind = OptimizerKind::Adam;
        QVERIFY(saveRunConfig(path, o).has_value());
        const auto loaded = loadRunConfig(path);
        QVERIFY2(loaded.has_value(), loaded ? "" : loaded.error().c_str());
        QCOMPARE(loaded->targetBatch, qint64(2048));
        QCOMPARE(loaded->optimizer.kind, OptimizerKind::Adam);

        const auto missing = loadRunConfig(dir.filePath(QStringLiteral("none.json")).toStdString());
        QVERIFY(!missing &&
                QString::fromStdString(missing.error()).contains(QStringLiteral("cannot read the configuration")));

        QFile broken(dir.filePath(QStringLiteral("broken.json")));
        QVERIFY(broken.open(QIODevice::WriteOnly));
        broken.write("{\"steps\": 5,");
        broken.close();
        const auto bad = loadRunConfig(broken.fileName().toStdString());
        QVERIFY(!bad);
        QVERIFY2(QString::fromStdString(bad.error()).contains(QStringLiteral("is not valid JSON")),
                 bad.error().c_str());
        QVERIFY(QString::fromStdString(bad.error()).contains(QStringLiteral("broken.json")));
    }
};

}  // namespace tst_run_config

BATCHPILOT_TEST_MAIN(tst_run_config::TestRunConfig)
#include "tst_run_config.moc"
