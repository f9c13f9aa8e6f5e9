// Models BatchPilot did not write: torchvision's ResNets, exported by the Python torch that matches
// the LibTorch under test (scripted and traced, BatchNorm and GroupNorm), trained into real
// out-of-memory errors, with fault injection, and probed against the true maximum.
#include <QtTest>
#include "tests/test_main.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include <torch/torch.h>

#include "core/device/counting_allocator.h"
#include "core/nn/model.h"
#include "core/train/trainer.h"
#include "tests/core/clean_run.h"
#include "yardstick/plain_loop.h"
#include "tests/core/recording_sink.h"

namespace tst_user_models {

using namespace batchpilot::core;
using batchpilot::tests::breakdownAt;
using batchpilot::tests::CleanRun;
using batchpilot::tests::finalWeights;
using batchpilot::tests::largestDifference;
using batchpilot::tests::measureCleanRun;
using batchpilot::tests::RecordingSink;

namespace {

constexpr int64_t kSamples = 48;

/// Where the models are: the folder CTest's export fixture wrote (BATCHPILOT_USER_MODELS), so that
/// the test functions, each run by CTest in its own process, share one export; run by hand without
/// it, the test exports them itself into a temporary folder.
QString& modelDir() {
    static QString dir = qEnvironmentVariable("BATCHPILOT_USER_MODELS");
    return dir;
}

std::string modelPath(const QString& file) {
    return QDir(modelDir()).filePath(file).toStdString();
}

TrainerOptions options(const QString& file, const std::string& device) {
    TrainerOptions o;
    // The largest micro-batch, not the measured fastest: runs with injected faults are compared with a clean one: the
    // same split, not a timed one.
    o.probe.objective = ProbeObjective::Largest;
    o.model.name = modelPath(file);
    o.data.samples = kSamples;
    o.data.channels = 3;
    o.data.height = o.data.width = 32;
    o.data.classes = 10;
    // Exact counting: the budgets here are computed from measured bytes, and some tests move the
    // allocator's budget by hand.
    o.device = device.starts_with("virtual:") && device.find('/') == std::string::npos ? device + "/exact" : device;
    o.targetBatch = 16;  // 48 = 3 × 16: three steps close an epoch
    o.steps = 4;
    o.seed = 5;
    o.regrowAfterSteps = 1;
    o.optimizer.kind = OptimizerKind::Sgd;  // momentum: state created in the first step
    o.optimizer.learningRate = 0.01;
    o.reportSampleIndices = true;
    o.intraOpThreads = 1;
    return o;
}

/// Every sample index exactly once per epoch, in committed micro-batches (every epoch, the last
/// one included: the runs here end on an epoch boundary or check the partial one by count).
QString sampleUseError(const RecordingSink& sink, int64_t steps, int64_t target) {
    std::map<int64_t, int64_t> epochOfStep;
    for (const auto& s : sink.all<StepMetrics>()) epochOfStep[s.step] = s.epoch;
    std::map<int64_t, std::multiset<int64_t>> perEpoch;
    for (const auto& m : sink.committedMicroBatches()) {
        perEpoch[epochOfStep.at(m.step)].insert(m.sampleIndices.begin(), m.sampleIndices.end());
    }
    int64_t total = 0;
    for (const auto& [epoch, samples] : perEpoch) {
        total += static_cast<int64_t>(samples.size());
        const auto distinct = std::set<int64_t>(samples.begin(), samples.end()).size();
        if (distinct != samples.size()) return QStringLiteral("epoch %1 used a sample twice").arg(epoch);
        const bool last = epoch == perEpoch.rbegin()->first;
        if (!last && samples.size() != size_t(kSamples)) {
            return QStringLiteral("epoch %1 used %2 of %3 samples").arg(epoch).arg(samples.size()).arg(kSamples);
        }
    }
    if (total != steps * target)
        return QStringLiteral("%1 samples committed, %2 expected").arg(total).arg(steps * target);
    return {};
}

}  // namespace

class TestUserModels : public QObject {
    Q_OBJECT

    std::map<QString, CleanRun> m_clean;

    /// A run without faults at a fixed micro-batch of 8 (see clean_run.h).
    const CleanRun& clean(const QString& file) {
        if (auto found = m_clean.find(file); found != m_clean.end()) return found->second;
        TrainerOptions o = options(file, "virtual:4GiB");
        o.probe.initialMicroBatch = o.probe.maxMicroBatch = 8;
        return m_clean.emplace(file, measureCleanRun(o)).first->second;
    }

private Q_SLOTS:
    void initTestCase() {
        installCountingAllocator();
        static QTemporaryDir exported;
        if (modelDir().isEmpty()) {
            QVERIFY(exported.isValid());
            modelDir() = exported.path();
            QProcess python;
            python.setProcessChannelMode(QProcess::MergedChannels);
            python.start(QStringLiteral(BATCHPILOT_TEST_PYTHON),
                         {QStringLiteral(BATCHPILOT_EXPORT_SCRIPT), modelDir()});
            QVERIFY2(python.waitForFinished(600000), "exporting the models took more than 10 minutes");
            QVERIFY2(
                python.exitStatus() == QProcess::NormalExit && python.exitCode() == 0,
                qPrintable(QStringLiteral("%1 could not export the test models (the scripts install torch and "
                                          "torchvision for it):\n%2")
                               .arg(QStringLiteral(BATCHPILOT_TEST_PYTHON), QString::fromLocal8Bit(python.readAll()))));
        }
        QFile versions(QDir(modelDir()).filePath(QStringLiteral("versions.txt")));
        QVERIFY2(versions.open(QIODevice::ReadOnly),
                 qPrintable(QStringLiteral("no exported models in %1 (BATCHPILOT_USER_MODELS): run the "
                                           "core.user_models.export test first, or unset it")
                                .arg(modelDir())));
        qInfo("models exported by %s", versions.readAll().replace('\n', ", ").constData());
    }

    /// Budgets between the peaks of a micro-batch of 2 and of 16 (128x128 images, so that forward
    /// activations outweigh the gradients backward allocates): the first trial at 16 runs out of
    /// memory where the budget ends — in forward for the lower budgets, in backward for the higher
    /// ones — and each run must still train to the end with every sample used once.
    void budgetOomInForwardAndBackward_data() {
        QTest::addColumn<QString>("file");
        for (const char* file :
             {"resnet18_bn_scripted.pt", "resnet18_bn_traced.pt", "resnet_gn_scripted.pt", "resnet_gn_traced.pt"}) {
            QTest::newRow(file) << QString::fromLatin1(file);
        }
    }
    void budgetOomInForwardAndBackward() {
        QFETCH(QString, file);
        const auto sized = [&](const std::string& device, int64_t micro) {
            TrainerOptions o = options(file, device);
            o.data.height = o.data.width = 128;
            o.probe.initialMicroBatch = micro;
            o.probe.headroom = 0;
            return o;
        };
        // The trial peaks of 2 and 16 samples on an unbounded device.
        const auto trialPeak = [&](int64_t micro) -> int64_t {
            RecordingSink sink;
            TrainerOptions o = sized("virtual:4GiB", micro);
            o.probe.maxMicroBatch = micro;
            o.steps = 1;
            Trainer trainer(o, sink);
            if (trainer.run().state != RunState::Finished) return 0;
            const auto trials = sink.all<ProbeTrial>();
            return !trials.empty() && trials.front().fit ? trials.front().peakBytes : 0;
        };
        const int64_t low = trialPeak(2);
        const int64_t high = trialPeak(16);
        QVERIFY2(low > 0 && high > low, qPrintable(QStringLiteral("peaks %1 and %2").arg(low).arg(high)));

        std::set<Phase> phases;
        for (double share : {0.1, 0.4, 0.7, 0.85, 0.97}) {
            RecordingSink sink;
            const int64_t budget = low + static_cast<int64_t>(share * double(high - low));
            TrainerOptions run = sized("virtual:" + std::to_string(budget) + "B", 16);
            run.steps = 3;
            Trainer trainer(run, sink);
            const RunResult result = trainer.run();
            QVERIFY2(
                result.state == RunState::Finished,
                qPrintable(QStringLiteral("budget %1 B: %2").arg(budget).arg(QString::fromStdString(result.error))));
            const auto ooms = sink.all<OomEvent>();
            QVERIFY2(!ooms.empty(), qPrintable(QStringLiteral("budget %1 B: no OOM").arg(budget)));
            for (const auto& oom : ooms) {
                QVERIFY2(oom.recovered, oom.message.c_str());
                QVERIFY2(oom.message.find("TorchScript interpreter") == std::string::npos,
                         qPrintable(QStringLiteral("the message must carry the inner reason: %1")
                                        .arg(QString::fromStdString(oom.message))));
                QVERIFY2(oom.message.find("out of memory") != std::string::npos, oom.message.c_str());
                phases.insert(oom.phase);
            }
            qInfo("share %.2f: first OOM in %s", share, toString(ooms.front().phase));
            const QString samples = sampleUseError(sink, 3, 16);
            QVERIFY2(samples.isEmpty(), qPrintable(samples));
        }
        QVERIFY2(phases.contains(Phase::Forward), "no budget ran out of memory in forward");
        QVERIFY2(phases.contains(Phase::Backward), "no budget ran out of memory in backward");
    }

    /// Memory taken away just before the first optimizer step (another process, say) and given
    /// back after the OOM: the step is retried and the run equals the undisturbed one.
    void budgetOomInFirstOptimizerStep_data() { budgetOomInForwardAndBackward_data(); }
    void budgetOomInFirstOptimizerStep() {
        QFETCH(QString, file);
        const CleanRun& reference = clean(file);
        auto& allocator = CountingAllocator::instance();
        RecordingSink sink;
        bool squeezed = false;
        int64_t budget = 0;
        int64_t heldForState = 0;
        sink.onEach = [&](const Event& e) {
            if (const auto* started = std::get_if<ProbeStarted>(&e)) heldForState = started->reservedBytes;
            if (const auto* m = std::get_if<MicroBatchDone>(&e);
                m && m->step == 1 && m->offset + m->size == 16 && !squeezed) {
                // The step first frees what the probe held for the optimizer state, then creates the
                // state: leave room for half of it.
                squeezed = true;
                budget = allocator.budget();
                allocator.setBudget(allocator.allocated() - heldForState / 2);
            } else if (const auto* oom = std::get_if<OomEvent>(&e); oom && oom->phase == Phase::OptimizerStep) {
                allocator.setBudget(budget);
            }
        };
        TrainerOptions o = options(file, "virtual:4GiB");
        o.probe.initialMicroBatch = o.probe.maxMicroBatch = 8;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        const auto ooms = sink.all<OomEvent>();
        QCOMPARE(ooms.size(), size_t(1));
        QCOMPARE(ooms.front().phase, Phase::OptimizerStep);
        QVERIFY(ooms.front().recovered);
        const double difference = largestDifference(finalWeights(trainer), reference.weights);
        QVERIFY2(difference <= 1e-6, qPrintable(QStringLiteral("max abs difference %1").arg(difference)));
    }

    /// Injected OOMs at distinct allocations (drawn without replacement, after set-up) until at
    /// least 20 (faultsPerPhase(): fewer in sanitizer builds) landed in forward, in backward and in
    /// optimizer steps, and 10 in the copy of a micro-batch's inputs: every run ends with the weights a plain training
    /// loop reaches on the micro-batches the run committed (clean_run.h, plainLoopWeights), and every sample used
    /// exactly once.
    void faultInjection_data() {
        QTest::addColumn<QString>("file");
        // GroupNorm: a smaller micro-batch after an OOM computes the same gradient. (BatchNorm's
        // batch statistics depend on the micro-batch, so its weights may not match exactly.)
        QTest::newRow("GroupNorm, scripted") << QStringLiteral("resnet_gn_scripted.pt");
        QTest::newRow("GroupNorm, traced") << QStringLiteral("resnet_gn_traced.pt");
    }
    void faultInjection() {
        constexpr size_t kCopyPoints = 10;
        QFETCH(QString, file);
        const CleanRun& reference = clean(file);
        QVERIFY(reference.microBatchAllocations.size() > 100);
        QVERIFY(reference.optimizerAllocations.size() >= 20);
        auto& allocator = CountingAllocator::instance();
        std::mt19937_64 random(7);
        auto microPool = reference.microBatchAllocations;
        auto stepPool = reference.optimizerAllocations;
        std::shuffle(microPool.begin(), microPool.end(), random);
        std::shuffle(stepPool.begin(), stepPool.end(), random);
        std::map<Phase, std::set<int64_t>> hit;
        const size_t perPhase = static_cast<size_t>(batchpilot::tests::faultsPerPhase());
        const auto inject = [&](int64_t failAt) {
            RecordingSink sink;
            batchpilot::tests::failAtFromFirstProbe(sink, failAt);
            TrainerOptions o = options(file, "virtual:4GiB");
            o.probe.initialMicroBatch = o.probe.maxMicroBatch = 8;
            Trainer trainer(o, sink);
            const RunResult result = trainer.run();
            allocator.failAfter(0);
            const double bound = batchpilot::tests::kPlainLoopBound;
            QVERIFY2(
                result.state == RunState::Finished,
                qPrintable(QStringLiteral("allocation %1: %2").arg(failAt).arg(QString::fromStdString(result.error))));
            // As in tst_fault_injection: LibTorch 2.x may absorb a failure inside oneDNN itself; the
            // run must then be undisturbed, and it does not count toward the phases.
            const auto ooms = sink.all<OomEvent>();
            QVERIFY2(ooms.size() <= 1,
                     qPrintable(QStringLiteral("allocation %1: %2 OOM events").arg(failAt).arg(ooms.size())));
            if (!ooms.empty()) {
                QVERIFY(ooms.front().recovered);
                hit[ooms.front().phase].insert(failAt);
            }
            // The weights of a plain training loop on exactly the micro-batches this run committed.
            const double difference =
                largestDifference(finalWeights(trainer), batchpilot::tests::plainLoopWeights(o, sink));
            const QString what = ooms.empty() ? QStringLiteral("no OOM event")
                                              : QStringLiteral("OOM in %1 at micro-batch %2: %3")
                                                    .arg(QString::fromStdString(toString(ooms.front().phase)))
                                                    .arg(ooms.front().microBatch)
                                                    .arg(QString::fromStdString(ooms.front().message.substr(0, 300)));
            QVERIFY2(difference <= bound, qPrintable(QStringLiteral("allocation %1 (%2): max abs difference %3, more "
                                                                    "than %4")
                                                         .arg(failAt)
                                                         .arg(what)
                                                         .arg(difference)
                                                         .arg(bound)));
            const QString samples = sampleUseError(sink, 4, 16);
            QVERIFY2(samples.isEmpty(), qPrintable(QStringLiteral("allocation %1: %2").arg(failAt).arg(samples)));
        };
        for (size_t i = 0;
             i < microPool.size() && (hit[Phase::Forward].size() < perPhase || hit[Phase::Backward].size() < perPhase);
             ++i) {
            inject(microPool[i]);
            if (QTest::currentTestFailed()) return;
        }
        for (size_t i = 0; i < stepPool.size() && hit[Phase::OptimizerStep].size() < perPhase; ++i) {
            inject(stepPool[i]);
            if (QTest::currentTestFailed()) return;
        }
        // The copy of a micro-batch to the device (inputs, then labels): its first two
        // allocations, aimed at (eight micro-batches in all here).
        std::vector<int64_t> firsts;
        for (const int64_t n : reference.firstOfMicroBatch) firsts.insert(firsts.end(), {n, n + 1});
        std::shuffle(firsts.begin(), firsts.end(), random);
        for (size_t i = 0; i < firsts.size() && hit[Phase::Copy].size() < kCopyPoints; ++i) {
            inject(firsts[i]);
            if (QTest::currentTestFailed()) return;
        }
        qInfo("distinct allocations hit: copy %zu, forward %zu, backward %zu, optimizer step %zu",
              hit[Phase::Copy].size(), hit[Phase::Forward].size(), hit[Phase::Backward].size(),
              hit[Phase::OptimizerStep].size());
        QVERIFY(hit[Phase::Forward].size() >= perPhase);
        QVERIFY(hit[Phase::Backward].size() >= perPhase);
        QVERIFY(hit[Phase::OptimizerStep].size() >= perPhase);
        QVERIFY(hit[Phase::Copy].size() >= kCopyPoints);
    }

    /// The probe reaches ≥ 97% of the true largest micro-batch (headroom 0) on a user's model.
    void probeFindsTrueMaximum_data() {
        QTest::addColumn<QString>("file");
        QTest::newRow("resnet18 BatchNorm, scripted") << QStringLiteral("resnet18_bn_scripted.pt");
        QTest::newRow("GroupNorm, traced") << QStringLiteral("resnet_gn_traced.pt");
        // Parameter-heavy: most of the budget is weights, gradients and optimizer state.
        QTest::newRow("transformer, scripted") << QStringLiteral("transformer_scripted.pt");
    }
    void probeFindsTrueMaximum() {
        QFETCH(QString, file);
        // Resident state of each model plus room for about 16 samples (often more: activations
        // grow slower than linearly at first), measured on this machine: the activations per
        // sample depend on the convolution code LibTorch picks for the CPU (seen: 7 samples of
        // resnet18 in 24 MiB on one CPU, far more on another).
        const MemoryBreakdown at4 = breakdownAt(options(file, "virtual:4GiB"), 4);
        const MemoryBreakdown at8 = breakdownAt(options(file, "virtual:4GiB"), 8);
        QCOMPARE(at4.activationMicroBatch, int64_t{4});
        QCOMPARE(at8.activationMicroBatch, int64_t{8});
        const int64_t resident = at8.parameterBytes + at8.gradientBytes + at8.optimizerStateBytes;
        const int64_t perSample = std::max<int64_t>(1, (at8.activationBytes - at4.activationBytes) / 4);
        const int64_t fixed = std::max<int64_t>(0, at4.activationBytes - 4 * perSample);
        const int64_t budget = resident + fixed + 16 * perSample;
        const std::string device = "virtual:" + std::to_string(budget) + "B";
        const auto base = [&] {
            TrainerOptions o = options(file, device);
            o.data.samples = 512;
            o.targetBatch = 512;
            o.probe.headroom = 0;
            // BatchNorm in training mode needs two samples when the last stage is 1x1 pixels.
            o.probe.initialMicroBatch = 2;
            o.steps = 2;
            return o;
        };
        // The truth: a plain LibTorch training loop (yardstick/plain_loop.h) on the same budget,
        // not the trainer's own trials.
        const TrainerOptions reference = base();
        batchpilot::yardstick::PlainLoopSetup loop;
        loop.model = reference.model;
        loop.data = reference.data;
        loop.optimizer = reference.optimizer;
        loop.budgetBytes = budget;
        const int64_t lo = batchpilot::yardstick::plainLoopLargest(loop, 512);
        QVERIFY2(lo > 8 && lo < 512,
                 qPrintable(QStringLiteral("the budget must bound the micro-batch; true max %1").arg(lo)));

        RecordingSink sink;
        Trainer trainer(base(), sink);
        const RunResult result = trainer.run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        const auto finished = sink.all<ProbeFinished>();
        QVERIFY(!finished.empty());
        const int64_t found = finished.front().microBatch;
        qInfo("%s: probe %lld of true %lld (%.1f%%) in %d trials", qPrintable(file), static_cast<long long>(found),
              static_cast<long long>(lo), 100.0 * double(found) / double(lo), finished.front().trials);
        QVERIFY2(double(found) >= 0.97 * double(lo),
                 qPrintable(QStringLiteral("probe %1 vs true %2").arg(found).arg(lo)));
        // What it chose trains: two batches of 512 at the chosen size without an OOM (an
        // overshooting probe would otherwise hide behind the recovery).
        QCOMPARE(sink.oomsAfterFirstProbe(), 0);
        QCOMPARE(result.steps, int64_t{2});
    }

    /// torchvision's ResNet-18 with BatchNorm at 32x32: its last feature map is 1x1, so BatchNorm
    /// refuses a single sample in training, where the probe starts. The run goes on from 2
    /// samples (saying why), never trains a micro-batch of 1, and loses no sample — with an odd
    /// target batch too, whose last part merges into the one before it (5 at most 2: 2 + 3).
    void batchNormStartsAtTwo_data() {
        QTest::addColumn<int64_t>("target");
        QTest::addColumn<int64_t>("maxMicroBatch");
        QTest::newRow("target 16") << int64_t{16} << int64_t{0};
        QTest::newRow("target 15") << int64_t{15} << int64_t{0};
        QTest::newRow("target 5, at most 2") << int64_t{5} << int64_t{2};
    }
    void batchNormStartsAtTwo() {
        QFETCH(int64_t, target);
        QFETCH(int64_t, maxMicroBatch);
        RecordingSink sink;
        TrainerOptions o = options(QStringLiteral("resnet18_bn_scripted.pt"), "virtual:4GiB");
        o.targetBatch = target;
        o.probe.maxMicroBatch = maxMicroBatch;
        o.steps = 3;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        bool said = false;
        for (const auto& w : sink.all<Warning>())
            said = said || w.message.find("cannot train on a single sample") != std::string::npos;
        QVERIFY(said);
        for (const auto& m : sink.all<MicroBatchDone>()) QVERIFY2(m.size >= 2, qPrintable(QString::number(m.size)));
        for (const auto& t : sink.all<ProbeTrial>()) QVERIFY(t.microBatch >= 2);
        const QString use = sampleUseError(sink, o.steps.value(), target);
        QVERIFY2(use.isEmpty(), qPrintable(use));
    }

    /// A real error inside a script is not an OOM: the run stops at once, never retried, and the
    /// message says what went wrong inside the model.
    void realErrorInsideScriptIsFatal() {
        RecordingSink sink;
        TrainerOptions o = options(QStringLiteral("resnet18_bn_scripted.pt"), "virtual:4GiB");
        // One sample per micro-batch: at 32x32 the last stage's BatchNorm sees one value per
        // channel, which torchvision's batch_norm rejects in training mode, inside the script.
        o.probe.initialMicroBatch = o.probe.maxMicroBatch = 1;
        Trainer trainer(o, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Failed);
        QVERIFY(sink.all<OomEvent>().empty());
        QVERIFY2(result.error.find("TorchScript interpreter") == std::string::npos, result.error.c_str());
        QVERIFY2(result.error.find("Expected more than 1 value per channel") != std::string::npos,
                 result.error.c_str());
    }
};

}  // namespace tst_user_models

BATCHPILOT_TEST_MAIN(tst_user_models::TestUserModels)
#include "tst_user_models.moc"
