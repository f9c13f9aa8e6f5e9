#include <QtTest>
#include "tests/test_main.h"

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>

#include <torch/torch.h>

#include "core/device/counting_allocator.h"
#include "core/device/torch_compat.h"
#include "core/nn/model.h"
#include "core/train/trainer.h"
#include "tests/core/clean_run.h"
#include "tests/core/recording_sink.h"

namespace tst_fault_injection {

using namespace batchpilot::core;
using batchpilot::tests::CleanRun;
using batchpilot::tests::finalWeights;
using batchpilot::tests::kPlainLoopBound;
using batchpilot::tests::largestDifference;
using batchpilot::tests::measureCleanRun;
using batchpilot::tests::RecordingSink;

namespace {

constexpr int64_t kSamples = 64;
constexpr int64_t kTarget = 24;  // 64 = 24 + 24 + 16: a short batch closes every epoch
constexpr int64_t kSteps = 8;    // three epochs, the last one partial

TrainerOptions options(OptimizerKind optimizer) {
    TrainerOptions o;
    // The largest micro-batch, not the measured fastest: the allocations drawn from the clean run must be the same ones
    // in the faulty run.
    o.probe.objective = ProbeObjective::Largest;
    // The ResNet-style model (GroupNorm: exact under any micro-batch split) has dozens of
    // parameter tensors, so the optimizer's allocations are many.
    o.model.name = "resnet";
    o.model.width = 8;
    o.data.samples = kSamples;
    o.data.height = o.data.width = 8;
    o.device = "virtual:1GiB";
    o.targetBatch = kTarget;
    o.steps = kSteps;
    o.seed = 9;
    o.regrowAfterSteps = 2;
    o.probe.initialMicroBatch = 4;
    o.optimizer.kind = optimizer;
    // Each optimizer at a usual rate for it.
    o.optimizer.learningRate = optimizer == OptimizerKind::Sgd ? 0.05 : 0.001;
    o.reportSampleIndices = true;
    o.intraOpThreads = 1;
    return o;
}

/// The other models and the memory savers, each injected on its own (everyModelRecovers).
struct Setting {
    const char* name;
    const char* model;
    MemorySavers savers;
    OptimizerKind optimizer;
};
constexpr Setting kSettings[] = {
    {"mlp", "mlp", MemorySavers::Off, OptimizerKind::Adam},
    {"cnn", "cnn", MemorySavers::Off, OptimizerKind::Sgd},
    {"resnet, activation checkpointing", "resnet", MemorySavers::Checkpoint, OptimizerKind::Adam},
    {"resnet, bfloat16", "resnet", MemorySavers::Bf16, OptimizerKind::Sgd},
#if BATCHPILOT_CPU_AUTOCASTS_FLOAT16  // LibTorch 1.13 refuses float16 on the CPU (tst_memory_savers)
    {"cnn, float16 with loss scaling", "cnn", MemorySavers::Fp16, OptimizerKind::Sgd},
#endif
};

TrainerOptions options(const Setting& setting) {
    TrainerOptions o = options(setting.optimizer);
    o.model.name = setting.model;
    o.memorySavers = setting.savers;
    return o;
}

/// OOMs that reach the trainer from allocations drawn inside micro-batches, and first allocations
/// of a micro-batch (the copy to the device), for each setting of kSettings.
constexpr size_t kSettingDraws = 8;
constexpr size_t kCopyPoints = 10;
/// Under bfloat16 or float16 a recovered OOM changes the split, and the half-precision rounding
/// with it: how far from the uninjected run the weights may end. Measured up to 0.028 (ResNet,
/// bfloat16, SGD at 0.05, LibTorch 1.13); a wrong recovery (a gradient kept twice, a step taken
/// on a part of a batch) moves them by the size of a whole update or more. The samples' check
/// below catches a lost or repeated sample in any case.
constexpr double kHalfPrecisionBound = 0.1;

}  // namespace

class TestFaultInjection : public QObject {
    Q_OBJECT

    std::map<OptimizerKind, CleanRun> m_clean;
    std::map<int, CleanRun> m_cleanSettings;

    const CleanRun& clean(OptimizerKind kind) {
        if (auto found = m_clean.find(kind); found != m_clean.end()) return found->second;
        return m_clean.emplace(kind, measureCleanRun(options(kind))).first->second;
    }

private Q_SLOTS:
    void initTestCase() { installCountingAllocator(); }

    /// For each optimizer: 40 distinct allocations inside micro-batches and 20 distinct ones inside
    /// optimizer steps (2n and n, n = faultsPerPhase(), 20 but in sanitizer builds), drawn without
    /// replacement, and 4 first allocations of a micro-batch (its
    /// copy to the device); each run recovers, ends with the weights a plain training loop reaches on
    /// the micro-batches the run committed (clean_run.h, plainLoopWeights), and uses every sample
    /// exactly once per epoch, the last partial one included.
    void recoversExactly_data() {
        QTest::addColumn<int>("optimizer");
        QTest::addColumn<qint64>("failAt");
        QTest::addColumn<bool>("inStep");
        const size_t perPhase = static_cast<size_t>(batchpilot::tests::faultsPerPhase());
        const auto microDraws = static_cast<std::ptrdiff_t>(2 * perPhase);
        for (OptimizerKind kind : {OptimizerKind::Sgd, OptimizerKind::Adam, OptimizerKind::AdamW}) {
            const CleanRun& run = clean(kind);
            if (run.microBatchAllocations.size() < 2 * perPhase || run.optimizerAllocations.size() < perPhase)
                qFatal("too few allocations to draw from");
            std::mt19937_64 random(2024 + static_cast<int>(kind));
            auto micro = run.microBatchAllocations;
            auto step = run.optimizerAllocations;
            std::shuffle(micro.begin(), micro.end(), random);
            std::shuffle(step.begin(), step.end(), random);
            for (std::ptrdiff_t i = 0; i < microDraws; ++i) {
                QTest::addRow("%s, micro-batch allocation %lld", toString(kind), static_cast<long long>(micro[i]))
                    << static_cast<int>(kind) << qint64(micro[i]) << false;
            }
            for (size_t i = 0; i < perPhase; ++i) {
                QTest::addRow("%s, optimizer allocation %lld", toString(kind), static_cast<long long>(step[i]))
                    << static_cast<int>(kind) << qint64(step[i]) << true;
            }
            // The copy to the device is two allocations of the hundreds a micro-batch makes: random
            // draws may all miss it, so a few are aimed at the first allocation of a micro-batch.
            auto firsts = run.firstOfMicroBatch;
            std::shuffle(firsts.begin(), firsts.end(), random);
            int aimed = 0;
            for (const int64_t n : firsts) {
                if (aimed == 4) break;
                if (std::find(micro.begin(), micro.begin() + microDraws, n) != micro.begin() + microDraws) continue;
                QTest::addRow("%s, first allocation of a micro-batch %lld", toString(kind), static_cast<long long>(n))
                    << static_cast<int>(kind) << qint64(n) << false;
                ++aimed;
            }
        }
    }
    void recoversExactly() {
        QFETCH(int, optimizer);
        QFETCH(qint64, failAt);
        QFETCH(bool, inStep);
        const auto kind = static_cast<OptimizerKind>(optimizer);
        auto& allocator = CountingAllocator::instance();
        RecordingSink sink;
        batchpilot::tests::failAtFromFirstProbe(sink, failAt);
        Trainer trainer(options(kind), sink);
        const RunResult result = trainer.run();
        allocator.failAfter(0);
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        QCOMPARE(result.steps, kSteps);

        // The injected failure reached the trainer as an OOM where it was aimed and was recovered
        // — or LibTorch absorbed it itself (LibTorch 2.x's oneDNN convolutions catch a failed
        // scratch allocation and take another path): then the run must be undisturbed all the same.
        const auto ooms = sink.all<OomEvent>();
        QVERIFY2(ooms.size() <= 1,
                 qPrintable(QStringLiteral("%1 OOM events for one injected failure").arg(ooms.size())));
        if (!inStep) ++m_microRows;
        if (ooms.empty()) {
            QVERIFY2(!inStep, "an injected failure in an optimizer step must reach the trainer");
            ++m_absorbed;
        } else {
            QVERIFY(ooms.front().recovered);
            QCOMPARE(ooms.front().phase == Phase::OptimizerStep, inStep);
            m_phasesHit[ooms.front().phase].insert({optimizer, failAt});
        }

        // The weights of a plain training loop on exactly the micro-batches this run committed.
        const auto weights = finalWeights(trainer);
        const auto reference = batchpilot::tests::plainLoopWeights(options(kind), sink);
        QCOMPARE(weights.size(), reference.size());
        const double worst = largestDifference(weights, reference);
        QVERIFY2(worst <= kPlainLoopBound,
                 qPrintable(QStringLiteral("max abs difference %1 from the plain loop's weights, bound %2")
                                .arg(worst)
                                .arg(kPlainLoopBound)));

        // Every sample index exactly once per epoch, in committed micro-batches; the last,
        // partial epoch holds exactly the samples of its steps, none twice.
        std::map<int64_t, int64_t> epochOfStep;
        for (const auto& s : sink.all<StepMetrics>()) epochOfStep[s.step] = s.epoch;
        std::map<int64_t, std::multiset<int64_t>> perEpoch;
        int64_t committed = 0;
        for (const auto& m : sink.committedMicroBatches()) {
            perEpoch[epochOfStep.at(m.step)].insert(m.sampleIndices.begin(), m.sampleIndices.end());
            committed += m.size;
        }
        const auto steps = sink.all<StepMetrics>();
        QCOMPARE(committed, steps.back().samplesSeen);
        for (const auto& [epoch, samples] : perEpoch) {
            QCOMPARE(std::set<int64_t>(samples.begin(), samples.end()).size(), samples.size());
            if (epoch != perEpoch.rbegin()->first) QCOMPARE(samples.size(), size_t(kSamples));
        }
        const int64_t lastEpochSamples = committed - kSamples * (static_cast<int64_t>(perEpoch.size()) - 1);
        QCOMPARE(static_cast<int64_t>(perEpoch.rbegin()->second.size()), lastEpochSamples);
    }

    /// The mlp, the cnn and each memory saver: 10 first allocations of a micro-batch (its copy to
    /// the device), each of which must reach the trainer as an OOM in the copy, then allocations
    /// drawn inside micro-batches until 8 reached the trainer (LibTorch 2.x's oneDNN absorbs some
    /// failures itself: such a run must be undisturbed, and at most 8 may be). Each recovers and
    /// uses every sample once per epoch. The weights: the plain loop's on the same micro-batches
    /// (float32 settings, as recoversExactly); under bfloat16 or float16 the plain loop computes
    /// in float32, so there they are compared with the uninjected run of the same setting.
    void everyModelRecovers_data() {
        QTest::addColumn<int>("setting");
        for (int i = 0; i < int(std::size(kSettings)); ++i) QTest::newRow(kSettings[i].name) << i;
    }
    void everyModelRecovers() {
        QFETCH(int, setting);
        const TrainerOptions o = options(kSettings[setting]);
        const CleanRun& clean = cleanSetting(setting);
        auto& allocator = CountingAllocator::instance();
        // One injected run: the phase its OOM landed in, or nullopt when LibTorch absorbed it.
        const auto inject = [&](int64_t failAt) -> std::optional<Phase> {
            RecordingSink sink;
            batchpilot::tests::failAtFromFirstProbe(sink, failAt);
            Trainer trainer(o, sink);
            const RunResult result = trainer.run();
            allocator.failAfter(0);
            const QString where = QStringLiteral("allocation %1: ").arg(failAt);
            [&] {
                QVERIFY2(result.state == RunState::Finished, qPrintable(where + QString::fromStdString(result.error)));
                QCOMPARE(result.steps, kSteps);
                const auto ooms = sink.all<OomEvent>();
                QVERIFY2(ooms.size() <= 1, qPrintable(where + QStringLiteral("%1 OOM events").arg(ooms.size())));
                if (!ooms.empty()) QVERIFY(ooms.front().recovered);
                const auto weights = finalWeights(trainer);
                if (o.memorySavers == MemorySavers::Off || o.memorySavers == MemorySavers::Checkpoint) {
                    const double worst = largestDifference(weights, batchpilot::tests::plainLoopWeights(o, sink));
                    QVERIFY2(worst <= kPlainLoopBound,
                             qPrintable(where + QStringLiteral("max abs difference %1 from the plain loop's weights, "
                                                               "bound %2")
                                                    .arg(worst)
                                                    .arg(kPlainLoopBound)));
                } else {
                    const double worst = largestDifference(weights, clean.weights);
                    m_halfPrecisionWorst = std::max(m_halfPrecisionWorst, worst);
                    QVERIFY2(worst <= kHalfPrecisionBound,
                             qPrintable(where + QStringLiteral("max abs difference %1 from the uninjected run's "
                                                               "weights, bound %2")
                                                    .arg(worst)
                                                    .arg(kHalfPrecisionBound)));
                }
                std::map<int64_t, int64_t> epochOfStep;
                for (const auto& s : sink.all<StepMetrics>()) epochOfStep[s.step] = s.epoch;
                std::map<int64_t, std::multiset<int64_t>> perEpoch;
                for (const auto& m : sink.committedMicroBatches())
                    perEpoch[epochOfStep.at(m.step)].insert(m.sampleIndices.begin(), m.sampleIndices.end());
                for (const auto& [epoch, samples] : perEpoch) {
                    QVERIFY2(std::set<int64_t>(samples.begin(), samples.end()).size() == samples.size(),
                             qPrintable(where + QStringLiteral("a sample used twice in epoch %1").arg(epoch)));
                    if (epoch != perEpoch.rbegin()->first)
                        QVERIFY2(samples.size() == size_t(kSamples),
                                 qPrintable(where +
                                            QStringLiteral("%1 samples in epoch %2").arg(samples.size()).arg(epoch)));
                }
            }();
            const auto ooms = sink.all<OomEvent>();
            return ooms.empty() ? std::nullopt : std::optional<Phase>(ooms.front().phase);
        };

        std::mt19937_64 random(77 + setting);
        auto firsts = clean.firstOfMicroBatch;
        std::shuffle(firsts.begin(), firsts.end(), random);
        QVERIFY(firsts.size() >= kCopyPoints);
        for (size_t k = 0; k < kCopyPoints; ++k) {
            const std::optional<Phase> phase = inject(firsts[k]);
            if (QTest::currentTestFailed()) return;
            QVERIFY2(phase == Phase::Copy,
                     qPrintable(QStringLiteral("allocation %1, the first of a micro-batch: %2")
                                    .arg(firsts[k])
                                    .arg(QString::fromStdString(phase ? toString(*phase) : "no OOM"))));
        }
        std::vector<int64_t> micro;
        for (const int64_t n : clean.microBatchAllocations)
            if (std::find(firsts.begin(), firsts.end(), n) == firsts.end()) micro.push_back(n);
        std::shuffle(micro.begin(), micro.end(), random);
        std::map<Phase, int> reached;
        int absorbed = 0;
        size_t reachedCount = 0;
        for (size_t k = 0; k < micro.size() && reachedCount < kSettingDraws && absorbed <= int(kSettingDraws); ++k) {
            const std::optional<Phase> phase = inject(micro[k]);
            if (QTest::currentTestFailed()) return;
            if (phase) {
                ++reached[*phase];
                ++reachedCount;
            } else {
                ++absorbed;
            }
        }
        qInfo("%s: %zu OOMs in the copy, then %d in forward, %d in backward; %d absorbed inside LibTorch",
              kSettings[setting].name, kCopyPoints, reached[Phase::Forward], reached[Phase::Backward], absorbed);
        QVERIFY2(reachedCount >= kSettingDraws,
                 qPrintable(QStringLiteral("only %1 drawn failures reached the trainer, %2 absorbed")
                                .arg(reachedCount)
                                .arg(absorbed)));
    }

    void coveredEveryPhase() {
        qInfo(
            "distinct injected OOMs: copy %zu, forward %zu, backward %zu, optimizer step %zu; absorbed inside LibTorch "
            "%d",
            m_phasesHit[Phase::Copy].size(), m_phasesHit[Phase::Forward].size(), m_phasesHit[Phase::Backward].size(),
            m_phasesHit[Phase::OptimizerStep].size(), m_absorbed);
        qInfo("everyModelRecovers: the half-precision runs ended at most %g from the uninjected ones (bound %g)",
              m_halfPrecisionWorst, kHalfPrecisionBound);
        // Three optimizers, each with 2n draws inside micro-batches and n inside optimizer steps.
        const auto n = static_cast<size_t>(batchpilot::tests::faultsPerPhase());
        QVERIFY2(m_phasesHit[Phase::Forward].size() >= n,
                 qPrintable(QStringLiteral("fewer than %1 distinct injected OOMs landed in forward passes").arg(n)));
        QVERIFY2(m_phasesHit[Phase::Backward].size() >= n,
                 qPrintable(QStringLiteral("fewer than %1 distinct injected OOMs landed in backward passes").arg(n)));
        QVERIFY2(
            m_phasesHit[Phase::OptimizerStep].size() >= 3 * n,
            qPrintable(QStringLiteral("fewer than %1 distinct injected OOMs landed in optimizer steps").arg(3 * n)));
        // Four aimed at the copy for each optimizer (everyModelRecovers asserts its own ten).
        QVERIFY2(m_phasesHit[Phase::Copy].size() >= 10,
                 qPrintable(QStringLiteral("%1 injected OOMs landed in a host-to-device copy, fewer than 10")
                                .arg(m_phasesHit[Phase::Copy].size())));
        // A failure LibTorch absorbs (2.x's oneDNN takes another path) tests nothing of BatchPilot's:
        // at most a third of the injections into micro-batches may end that way.
        QVERIFY2(m_absorbed * 3 <= m_microRows,
                 qPrintable(QStringLiteral("%1 of %2 injected failures were absorbed inside LibTorch")
                                .arg(m_absorbed)
                                .arg(m_microRows)));
    }

private:
    const CleanRun& cleanSetting(int i) {
        if (auto found = m_cleanSettings.find(i); found != m_cleanSettings.end()) return found->second;
        return m_cleanSettings.emplace(i, measureCleanRun(options(kSettings[i]))).first->second;
    }

    double m_halfPrecisionWorst = 0;
    std::map<Phase, std::set<std::pair<int, qint64>>> m_phasesHit;
    int m_absorbed = 0;
    int m_microRows = 0;
};

}  // namespace tst_fault_injection

BATCHPILOT_TEST_MAIN(tst_fault_injection::TestFaultInjection)
#include "tst_fault_injection.moc"
