#include <QtTest>
#include "tests/test_main.h"

#include <QTemporaryDir>

#include <fstream>

#include <torch/torch.h>

#include "core/train/checkpoint.h"
#include "core/data/dataset.h"
#include "core/optim/optimizer.h"
#include "core/train/trainer.h"
#include "core/nn/model.h"
#include "tests/core/recording_sink.h"

namespace tst_checkpoint {

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;

namespace {

TrainerOptions options(const QString& directory = {}) {
    TrainerOptions o;
    // The largest micro-batch, not the measured fastest: a resumed run is compared with an uninterrupted one: both
    // split their batches the same way.
    o.probe.objective = ProbeObjective::Largest;
    o.model.name = "cnn";
    o.model.width = 8;
    o.data.samples = 200;  // 200 = 3 × 64 + 8: epochs end on a short batch
    o.data.height = o.data.width = 10;
    // Micro-batches below the target: accumulation is active. Exact counting: a 4 MiB budget
    // under the caching model is two small segments.
    o.device = "virtual:4MiB/exact";
    o.targetBatch = 64;
    o.steps = 9;
    o.seed = 4;
    o.optimizer.kind = OptimizerKind::Adam;
    o.optimizer.learningRate = 0.01;
    o.checkpoint.directory = directory.toStdString();
    return o;
}

std::map<int64_t, double> losses(const RecordingSink& sink) {
    std::map<int64_t, double> out;
    for (const auto& s : sink.all<StepMetrics>()) out[s.step] = s.loss;
    return out;
}

}  // namespace

class TestCheckpoint : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void resumeReproducesUninterruptedRun() {
        RecordingSink straight;
        Trainer reference(options(), straight);
        QCOMPARE(reference.run().steps, qint64(9));
        const auto expected = losses(straight);

        QTemporaryDir dir;
        RecordingSink first;
        Trainer interrupted(options(dir.path()), first);
        first.onEach = [&](const Event& e) {
            if (const auto* s = std::get_if<StepMetrics>(&e); s && s->step == 4) interrupted.stop();
        };
        const RunResult stopped = interrupted.run();
        QVERIFY(stopped.stopped);
        QCOMPARE(stopped.steps, qint64(4));
        QCOMPARE(first.all<CheckpointSaved>().size(), size_t(1));

        TrainerOptions again = options(dir.path());
        again.resumeFrom = dir.path().toStdString();
        RecordingSink second;
        Trainer resumed(again, second);
        const RunResult result = resumed.run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        QCOMPARE(result.steps, qint64(9));
        const auto got = losses(second);
        QCOMPARE(got.begin()->first, qint64(5));
        for (const auto& [step, loss] : got) {
            QVERIFY2(std::abs(loss - expected.at(step)) <= 1e-6,
                     qPrintable(QStringLiteral("step %1: %2 vs %3").arg(step).arg(loss).arg(expected.at(step))));
        }
        // No probe on resume: the saved micro-batch is known to fit this device.
        QVERIFY(second.all<ProbeStarted>().empty());
        const auto a = reference.model()->parameters();
        const auto b = resumed.model()->parameters();
        for (size_t i = 0; i < a.size(); ++i) QVERIFY((a[i] - b[i]).abs().max().item<double>() <= 1e-6);
    }

    void savesEveryNStepsAtomically() {
        QTemporaryDir dir;
        TrainerOptions o = options(dir.path());
        o.checkpoint.everySteps = 2;
        o.steps = 5;
        RecordingSink sink;
        Trainer trainer(o, sink);
        QCOMPARE(trainer.run().steps, qint64(5));
        std::vector<int64_t> steps;
        for (const auto& c : sink.all<CheckpointSaved>()) steps.push_back(c.step);
        QCOMPARE(steps, (std::vector<int64_t>{2, 4, 5}));
        QVERIFY(QFile::exists(dir.filePath(QStringLiteral("checkpoint.pt"))));
        QVERIFY(!QFile::exists(dir.filePath(QStringLiteral("checkpoint.pt.tmp"))));
        // A half-written temporary file left by a crash does not affect resuming.
        QFile partial(dir.filePath(QStringLiteral("checkpoint.pt.tmp")));
        QVERIFY(partial.open(QIODevice::WriteOnly));
        partial.write("PK\x03\x04 half a zip");
        partial.close();
        TrainerOptions again = options(dir.path());
        again.resumeFrom = dir.path().toStdString();
        again.steps = 6;
        RecordingSink resumed;
        Trainer next(again, resumed);
        const RunResult result = next.run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        QCOMPARE(resumed.all<StepMetrics>().size(), size_t(1));
    }

    /// Keeping the best model (--keep-best): it is saved to best/ after exactly the validation
    /// passes that beat every earlier one (a tie keeps the earlier model), and the model saved
    /// there scores its recorded value again when a run resumes from it.
    void keepsBestModel_data() {
        QTest::addColumn<QString>("metric");
        QTest::newRow("lowest val_loss") << QStringLiteral("val_loss");
        QTest::newRow("highest val_accuracy") << QStringLiteral("val_accuracy");
    }
    void keepsBestModel() {
        QFETCH(QString, metric);
        const bool accuracy = metric == QStringLiteral("val_accuracy");
        // The reference: read from the validation events, not through the trainer's helpers.
        const auto valueOf = [&](const ValidationDone& v) { return accuracy ? v.accuracy : v.loss; };
        const auto beats = [&](double a, double b) { return accuracy ? a > b : a < b; };
        const auto withValidation = [&](const QString& directory) {
            TrainerOptions o = options(directory);
            o.validation.split = 0.2;  // synthetic data: 40 held-out samples of its own
            o.model.name = "mlp";
            o.validation.everySteps = 1;
            o.checkpoint.keepBest = metric.toStdString();
            // Uneven progress (seen: validation accuracy 0.175, 0.85, 0.9, 0.975, 0.95, 0.975, 0.975,
            // 1, 0.975): passes that improve, fall back and tie.
            o.optimizer.learningRate = 0.05;
            return o;
        };
        QTemporaryDir dir;
        RecordingSink sink;
        Trainer trainer(withValidation(dir.path()), sink);
        QCOMPARE(trainer.run().steps, qint64(9));
        std::vector<int64_t> expectedSteps;
        std::optional<ValidationDone> best;
        for (const auto& v : sink.all<ValidationDone>()) {
            if (!best || beats(valueOf(v), valueOf(*best))) {
                best = v;
                expectedSteps.push_back(v.step);
            }
        }
        QCOMPARE(sink.all<ValidationDone>().size(), size_t(9));
        QVERIFY2(expectedSteps.size() < 9, "every pass improved: the run does not test a drop or a tie");
        std::vector<int64_t> savedSteps;
        std::vector<double> savedValues;
        const QString bestDir = dir.filePath(QStringLiteral("best"));
        for (const auto& c : sink.all<CheckpointSaved>()) {
            if (c.metric.empty()) continue;
            QCOMPARE(QString::fromStdString(c.metric), metric);
            QCOMPARE(QString::fromStdString(c.path), bestDir + QStringLiteral("/checkpoint.pt"));
            savedSteps.push_back(c.step);
            savedValues.push_back(c.value);
        }
        QCOMPARE(savedSteps, expectedSteps);
        QCOMPARE(savedValues.back(), valueOf(*best));
        QVERIFY(QFile::exists(dir.filePath(QStringLiteral("checkpoint.pt"))));  // the latest, as before

        // Resumed from best/ up to its own step: no training, and the end-of-run validation
        // evaluates the kept model. The best value so far travels with the checkpoint: an equal
        // accuracy (counted, so exactly equal) is no improvement and saves nothing.
        QTemporaryDir elsewhere;
        TrainerOptions again = withValidation(elsewhere.path());
        again.resumeFrom = bestDir.toStdString();
        again.steps = best->step;
        RecordingSink resumedSink;
        Trainer resumed(again, resumedSink);
        const RunResult result = resumed.run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        QVERIFY(resumedSink.all<StepMetrics>().empty());
        const auto passes = resumedSink.all<ValidationDone>();
        QCOMPARE(passes.size(), size_t(1));
        QCOMPARE(passes.front().step, best->step);
        QVERIFY2(std::abs(valueOf(passes.front()) - valueOf(*best)) <= 1e-5 * std::max(1.0, valueOf(*best)),
                 qPrintable(QStringLiteral("%1 vs %2").arg(valueOf(passes.front())).arg(valueOf(*best))));
        bool savedAgain = false;
        for (const auto& c : resumedSink.all<CheckpointSaved>()) savedAgain = savedAgain || !c.metric.empty();
        if (accuracy)
            QVERIFY(!savedAgain);
        else
            QVERIFY(!savedAgain || valueOf(passes.front()) < valueOf(*best));

        // The latest checkpoint of a step whose validation found a new best (here every step
        // saves one, before that step's validation) records that best too: a run resumed from it
        // compares with it, and the same model scoring the same accuracy saves nothing.
        QTemporaryDir latestDir;
        TrainerOptions upToBest = withValidation(latestDir.path());
        upToBest.checkpoint.everySteps = 1;
        upToBest.steps = best->step;
        RecordingSink upToBestSink;
        Trainer upToBestTrainer(upToBest, upToBestSink);
        QCOMPARE(upToBestTrainer.run().steps, best->step);
        TrainerOptions fromLatest = withValidation(latestDir.path());
        fromLatest.resumeFrom = latestDir.path().toStdString();
        fromLatest.steps = best->step;
        RecordingSink fromLatestSink;
        Trainer fromLatestTrainer(fromLatest, fromLatestSink);
        QVERIFY(fromLatestTrainer.run().state == RunState::Finished);
        QCOMPARE(fromLatestSink.all<ValidationDone>().size(), size_t(1));
        bool savedFromLatest = false;
        for (const auto& c : fromLatestSink.all<CheckpointSaved>())
            savedFromLatest = savedFromLatest || !c.metric.empty();
        if (accuracy) QVERIFY(!savedFromLatest);
    }

    /// A checkpoint written before training_samples was recorded (-1 on load) resumes; it warns
    /// only where a share was held out of the data (the training set it walked may have been
    /// larger), not for synthetic data, whose held-out samples are extra ones of its own.
    void unrecordedTrainingSizeWarnsOnlyWhenHeldOut_data() {
        QTest::addColumn<bool>("heldOutOfData");
        QTest::newRow("synthetic, extra held-out samples") << false;
        QTest::newRow("a share held out of the data") << true;
    }
    void unrecordedTrainingSizeWarnsOnlyWhenHeldOut() {
        QFETCH(bool, heldOutOfData);
        QTemporaryDir dir;
        TrainerOptions o = options(dir.path());
        o.steps = 2;
        o.validation.split = 0.2;
        if (heldOutOfData) {  // data from a factory is split like a file's
            o.datasetFactory = [data = o.data]() -> tl::expected<std::shared_ptr<Dataset>, std::string> {
                return std::make_shared<SyntheticImages>(data);
            };
        }
        RecordingSink first;
        Trainer writer(o, first);
        QCOMPARE(writer.run().steps, qint64(2));
        // Rewrite the checkpoint as an older BatchPilot wrote it: without the training set's size.
        const auto model = writer.model();
        Optimizer optimizer(o.optimizer, model->parameters());
        auto state = loadCheckpoint(dir.path().toStdString(), *model, optimizer);
        QVERIFY2(state.has_value(), state ? "" : state.error().c_str());
        QCOMPARE(state->trainingSamples, heldOutOfData ? int64_t{160} : int64_t{200});
        state->trainingSamples = -1;
        QVERIFY(saveCheckpoint(dir.path().toStdString(), *model, optimizer, *state).has_value());

        TrainerOptions again = o;
        again.steps = 3;
        again.resumeFrom = dir.path().toStdString();
        RecordingSink resumed;
        Trainer next(again, resumed);
        const RunResult result = next.run();
        QVERIFY2(result.state != RunState::Failed, result.error.c_str());
        QCOMPARE(result.steps, qint64(3));
        bool warned = false;
        for (const auto& w : resumed.all<Warning>())
            warned = warned || w.message.find("does not record how many samples") != std::string::npos;
        QCOMPARE(warned, heldOutOfData);
    }

    void rejectsBadCheckpoints_data() {
        QTest::addColumn<QString>("change");
        QTest::addColumn<QString>("message");
        QTest::newRow("corrupt") << QStringLiteral("corrupt")
                                 << QStringLiteral("is corrupt or not a BatchPilot checkpoint");
        QTest::newRow("missing") << QStringLiteral("missing") << QStringLiteral("no checkpoint to resume from");
        QTest::newRow("other model") << QStringLiteral("model")
                                     << QStringLiteral("was written for model \"cnn\", but this run builds \"mlp\"");
        QTest::newRow("other optimizer") << QStringLiteral("optimizer")
                                         << QStringLiteral("written with the adam optimizer, but this run uses sgd");
        QTest::newRow("other width") << QStringLiteral("width")
                                     << QStringLiteral("does not match this model's parameters");
        // The sampler's position would point into another set of samples.
        QTest::newRow("other training set")
            << QStringLiteral("samples")
            << QStringLiteral("written while training on 200 samples, but this run trains on 150");
        // Every sample once per epoch needs the same samples in the same order (issue 39: these
        // resumed without a word, skipping and repeating samples).
        QTest::newRow("other seed") << QStringLiteral("seed")
                                    << QStringLiteral("was written by a run with --seed 4, but this run has --seed 5");
        QTest::newRow("other data seed")
            << QStringLiteral("data seed")
            << QStringLiteral(
                   "was written while training on other data (synthetic 3x10x10, 10 classes, 200 samples, "
                   "generator seed 1); this run's is synthetic 3x10x10, 10 classes, 200 samples, "
                   "generator seed 2");
    }
    void rejectsBadCheckpoints() {
        QFETCH(QString, change);
        QFETCH(QString, message);
        QTemporaryDir dir;
        TrainerOptions o = options(dir.path());
        o.steps = 1;
        RecordingSink sink;
        Trainer trainer(o, sink);
        QCOMPARE(trainer.run().steps, qint64(1));
        TrainerOptions again = options(dir.path());
        again.resumeFrom = dir.path().toStdString();
        if (change == QStringLiteral("corrupt")) {
            QFile file(dir.filePath(QStringLiteral("checkpoint.pt")));
            QVERIFY(file.open(QIODevice::WriteOnly | QIODevice::Truncate));
            file.write("not a checkpoint at all");
        }
        if (change == QStringLiteral("missing"))
            again.resumeFrom = dir.filePath(QStringLiteral("elsewhere")).toStdString();
        if (change == QStringLiteral("model")) again.model.name = "mlp";
        if (change == QStringLiteral("optimizer")) again.optimizer.kind = OptimizerKind::Sgd;
        if (change == QStringLiteral("width")) again.model.width = 16;
        if (change == QStringLiteral("samples")) again.data.samples = 150;
        if (change == QStringLiteral("seed")) again.seed = 5;
        if (change == QStringLiteral("data seed")) again.data.seed = 2;
        RecordingSink failed;
        Trainer next(again, failed);
        const RunResult result = next.run();
        QCOMPARE(result.state, RunState::Failed);
        QVERIFY2(QString::fromStdString(result.error).contains(message), result.error.c_str());
    }

    // Another learning rate on resume: the checkpoint's goes on (with the optimizer's state), and
    // the run says so (issue 39: --lr was dropped without a word).
    void anotherLearningRateIsNamed() {
        QTemporaryDir dir;
        TrainerOptions o = options(dir.path());
        o.steps = 1;
        RecordingSink first;
        QCOMPARE(Trainer(o, first).run().steps, qint64(1));
        TrainerOptions again = options(dir.path());
        again.resumeFrom = dir.path().toStdString();
        again.steps = 2;
        again.optimizer.learningRate = 0.5;
        RecordingSink sink;
        const RunResult result = Trainer(again, sink).run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        bool said = false;
        for (const Warning& w : sink.all<Warning>())
            said = said || QString::fromStdString(w.message).contains(
                               QStringLiteral("learning rate 0.5 (--lr, or the default) is not used: a "
                                              "resumed run goes on at its checkpoint's 0.01"));
        QVERIFY(said);
        QCOMPARE(sink.all<StepMetrics>().back().learningRate, 0.01);
        // The same rate: nothing to say.
        again.optimizer.learningRate = 0.01;
        again.steps = 3;
        RecordingSink quiet;
        QCOMPARE(Trainer(again, quiet).run().state, RunState::Finished);
        for (const Warning& w : quiet.all<Warning>())
            QVERIFY2(!QString::fromStdString(w.message).contains(QStringLiteral("learning rate")), w.message.c_str());
    }

    // A data file whose content changed (one value), its size the same: refused by its content's
    // CRC-32 (the number of samples alone let it through).
    void resumeRefusesChangedDataFile() {
        QTemporaryDir dir;
        const QString csv = dir.filePath(QStringLiteral("table.csv"));
        const auto writeTable = [&](int first) {
            std::ofstream out(csv.toStdString());
            out << "x,y,label\n";
            for (int i = 0; i < 120; ++i) out << (i == 0 ? first : i) << ',' << (i * 7) % 13 << ',' << i % 2 << '\n';
        };
        writeTable(0);
        TrainerOptions o;
        o.model.name = "mlp";
        o.model.width = 8;
        o.data.name = "csv";
        o.data.path = csv.toStdString();
        o.data.targetColumn = "label";
        o.device = "virtual:16MiB";
        o.targetBatch = 32;
        o.steps = 1;
        o.checkpoint.directory = dir.filePath(QStringLiteral("ck")).toStdString();
        RecordingSink sink;
        const RunResult first = Trainer(o, sink).run();
        QVERIFY2(first.state == RunState::Finished, first.error.c_str());
        TrainerOptions again = o;
        again.steps = 2;
        again.resumeFrom = o.checkpoint.directory;
        {
            RecordingSink same;
            const RunResult resumed = Trainer(again, same).run();
            QVERIFY2(resumed.state == RunState::Finished, resumed.error.c_str());  // the same file resumes
        }
        writeTable(1000);
        RecordingSink failed;
        const RunResult refused = Trainer(again, failed).run();
        QCOMPARE(refused.state, RunState::Failed);
        QVERIFY(refused.badInput);
        QVERIFY2(
            QString::fromStdString(refused.error)
                .contains(QStringLiteral("was written while training on other data (CSV table.csv, content CRC-32 ")),
            refused.error.c_str());
    }
};

}  // namespace tst_checkpoint

BATCHPILOT_TEST_MAIN(tst_checkpoint::TestCheckpoint)
#include "tst_checkpoint.moc"
