#include <QtTest>

#include <map>
#include <random>
#include <set>

#include <torch/torch.h>

#include "core/counting_allocator.h"
#include "core/model.h"
#include "core/trainer.h"
#include "recording_sink.h"

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;

namespace {

constexpr int64_t kSamples = 64;
constexpr int64_t kTarget = 24;  // 64 = 24 + 24 + 16: a short batch closes every epoch

TrainerOptions options() {
    TrainerOptions o;
    o.model.name = "mlp";
    o.model.width = 8;
    o.data.samples = kSamples;
    o.data.height = o.data.width = 6;
    o.device = "virtual:1GiB";
    o.targetBatch = kTarget;
    o.steps = 8;  // three epochs
    o.seed = 9;
    o.regrowAfterSteps = 2;
    o.optimizer.kind = OptimizerKind::Adam;  // allocates state and scratch in the step
    o.optimizer.learningRate = 0.01;
    o.reportSampleIndices = true;
    return o;
}

/// Counted-allocation numbers (relative to the run's start) that fall in each phase of a clean
/// run: between micro-batches (copy, forward, backward) and inside optimizer steps.
struct Phases {
    std::vector<int64_t> microBatch;
    std::vector<int64_t> optimizerStep;
    int64_t total = 0;
};

std::vector<torch::Tensor> finalWeights(Trainer& trainer) {
    std::vector<torch::Tensor> out;
    for (const auto& p : trainer.model()->parameters()) out.push_back(p.detach().clone());
    return out;
}

}  // namespace

class TestFaultInjection : public QObject {
    Q_OBJECT

    std::vector<torch::Tensor> m_clean;
    Phases m_phases;

private Q_SLOTS:
    void initTestCase() {
        installCountingAllocator();
        auto& allocator = CountingAllocator::instance();
        RecordingSink sink;
        int64_t start = 0;
        int64_t lastMicro = 0;
        sink.onEach = [&](const Event& e) {
            const int64_t now = allocator.countedAllocations();
            if (const auto* s = std::get_if<RunStateChanged>(&e); s && s->state == RunState::Starting) {
                start = now;
            } else if (std::holds_alternative<MicroBatchDone>(e)) {
                for (int64_t n = lastMicro + 1; n <= now - start; ++n) m_phases.microBatch.push_back(n);
                lastMicro = now - start;
            } else if (std::holds_alternative<OptimizerStepped>(e)) {
                for (int64_t n = lastMicro + 1; n <= now - start; ++n) m_phases.optimizerStep.push_back(n);
                lastMicro = now - start;
            }
        };
        Trainer trainer(options(), sink);
        const RunResult result = trainer.run();
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        QVERIFY(sink.all<OomEvent>().empty());
        m_phases.total = allocator.countedAllocations() - start;
        m_clean = finalWeights(trainer);
        QVERIFY(m_phases.microBatch.size() > 100);
        QVERIFY(!m_phases.optimizerStep.empty());
    }

    void recoversExactly_data() {
        QTest::addColumn<qint64>("failAt");
        std::mt19937_64 random(2024);
        for (int seed = 0; seed < 60; ++seed) {
            // Every third seed aims at an optimizer step, the rest anywhere in micro-batches.
            const auto& pool = seed % 3 == 2 ? m_phases.optimizerStep : m_phases.microBatch;
            const auto n = pool[random() % pool.size()];
            QTest::addRow("seed %d, allocation %lld", seed, static_cast<long long>(n)) << qint64(n);
        }
    }
    void recoversExactly() {
        QFETCH(qint64, failAt);
        auto& allocator = CountingAllocator::instance();
        RecordingSink sink;
        sink.onEach = [&](const Event& e) {
            if (const auto* s = std::get_if<RunStateChanged>(&e); s && s->state == RunState::Starting) {
                allocator.failAfter(failAt);
            }
        };
        Trainer trainer(options(), sink);
        const RunResult result = trainer.run();
        allocator.failAfter(0);
        QVERIFY2(result.state == RunState::Finished, result.error.c_str());
        QCOMPARE(result.steps, qint64(8));

        // The injected failure happened, was an OOM, and was recovered.
        const auto ooms = sink.all<OomEvent>();
        QCOMPARE(ooms.size(), size_t(1));
        QVERIFY(ooms.front().recovered);
        m_phasesHit.insert(ooms.front().phase);

        // Same final weights as the run without a fault.
        const auto weights = finalWeights(trainer);
        double worst = 0;
        for (size_t i = 0; i < weights.size(); ++i) {
            worst = std::max(worst, (weights[i] - m_clean[i]).abs().max().item<double>());
        }
        QVERIFY2(worst <= 1e-6, qPrintable(QStringLiteral("max abs difference %1").arg(worst)));

        // Every sample index exactly once per epoch, in committed micro-batches.
        std::map<int64_t, std::multiset<int64_t>> perEpoch;
        int64_t epochStep = 0;
        std::map<int64_t, int64_t> epochOfStep;
        for (const auto& s : sink.all<StepMetrics>()) epochOfStep[s.step] = s.epoch;
        for (const auto& m : sink.all<MicroBatchDone>()) {
            epochStep = epochOfStep.at(m.step);
            perEpoch[epochStep].insert(m.sampleIndices.begin(), m.sampleIndices.end());
        }
        for (const auto& [epoch, samples] : perEpoch) {
            if (epoch == perEpoch.rbegin()->first && samples.size() < size_t(kSamples)) continue;  // run ended mid-epoch
            QCOMPARE(samples.size(), size_t(kSamples));
            QCOMPARE(std::set<int64_t>(samples.begin(), samples.end()).size(), size_t(kSamples));
        }
    }

    void coveredEveryPhase() {
        QVERIFY2(m_phasesHit.contains(Phase::Forward), "no injected OOM landed in a forward pass");
        QVERIFY2(m_phasesHit.contains(Phase::Backward), "no injected OOM landed in a backward pass");
        QVERIFY2(m_phasesHit.contains(Phase::OptimizerStep), "no injected OOM landed in an optimizer step");
        QVERIFY2(m_phasesHit.contains(Phase::Copy), "no injected OOM landed in a host-to-device copy");
    }

private:
    std::set<Phase> m_phasesHit;
};

QTEST_APPLESS_MAIN(TestFaultInjection)
#include "tst_fault_injection.moc"
