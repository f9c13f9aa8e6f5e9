#include <QtTest>
#include "tests/test_main.h"

#include <QTemporaryDir>

#include <atomic>
#include <thread>

#include "core/device/counting_allocator.h"
#include "core/train/trainer.h"
#include "tests/core/recording_sink.h"

namespace tst_trainer_commands {

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;

namespace {

TrainerOptions small() {
    TrainerOptions o;
    o.model.name = "cnn";
    o.model.width = 8;
    o.data.samples = 512;
    o.data.height = o.data.width = 12;
    // Exact counting: the tests count probes and sizes that a few MiB of the caching model's
    // 2 and 20 MiB segments would decide instead.
    o.device = "virtual:8MiB/exact";
    o.targetBatch = 256;
    o.steps = 6;
    return o;
}

/// Index of the first event matching `pred` after position `from`, or -1.
template <typename T, typename Pred>
int indexOf(const std::vector<Event>& events, size_t from, Pred pred) {
    for (size_t i = from; i < events.size(); ++i) {
        if (const auto* e = std::get_if<T>(&events[i]); e && pred(*e)) return int(i);
    }
    return -1;
}

/// A run of small() on a 64 MiB virtual GPU whose target batch is set to `target` once step 2
/// is done, with learning-rate scaling `rule` (none given: the run's `configured` rule).
RunState runChangingTargetAfterStep2(RecordingSink& sink, int64_t target,
                                     std::optional<LrScaling> rule = LrScaling::Linear,
                                     LrScaling configured = LrScaling::None) {
    TrainerOptions o = small();
    o.device = "virtual:64MiB/exact";
    o.lrScaling = configured;
    Trainer trainer(o, sink);
    sink.onEach = [&](const Event& e) {
        if (const auto* s = std::get_if<StepMetrics>(&e); s && s->step == 2) trainer.setTargetBatch(target, rule);
    };
    return trainer.run().state;
}

}  // namespace

class TestTrainerCommands : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void stopActsWithinOneMicroBatch() {
        RecordingSink sink;
        Trainer trainer(small(), sink);
        int microBatches = 0;
        sink.onEach = [&](const Event& e) {
            if (std::holds_alternative<MicroBatchDone>(e) && ++microBatches == 5) trainer.stop();
        };
        const RunResult result = trainer.run();
        QVERIFY(result.stopped);
        QCOMPARE(result.state, RunState::Finished);
        QCOMPARE(int(sink.all<MicroBatchDone>().size()), 5);
        QCOMPARE(sink.all<RunStateChanged>().back().detail, std::string("stopped"));
    }

    /// Stop while the data is still loading: the image-folder loader gives up at its next file and
    /// the run ends as stopped (not failed), with nothing trained.
    void stopWhileLoadingCancelsTheLoad() {
        QTemporaryDir dir;
        for (const char* cls : {"a", "b"}) {
            QVERIFY(QDir(dir.path()).mkpath(QString::fromLatin1(cls)));
            for (int i = 0; i < 20; ++i) {
                QFile image(dir.filePath(QStringLiteral("%1/%2.pgm").arg(QString::fromLatin1(cls)).arg(i)));
                QVERIFY(image.open(QIODevice::WriteOnly));
                image.write(QByteArray("P5\n2 2\n255\n") + QByteArray(4, char(i * 10)));
            }
        }
        TrainerOptions o = small();
        o.data.name = "image-folder";
        o.data.path = dir.path().toStdString();
        o.data.channels = 1;
        o.data.height = o.data.width = 4;
        o.targetBatch = 8;
        RecordingSink sink;
        Trainer trainer(o, sink);
        // The first event comes before loading starts.
        sink.onEach = [&](const Event& e) {
            if (const auto* s = std::get_if<RunStateChanged>(&e); s && s->state == RunState::Starting) trainer.stop();
        };
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Finished);
        QVERIFY(result.stopped);
        QCOMPARE(result.steps, qint64(0));
        QVERIFY(sink.all<ErrorEvent>().empty());
        QVERIFY(sink.all<ProbeTrial>().empty());
        QCOMPARE(QString::fromStdString(sink.all<RunStateChanged>().back().detail),
                 QStringLiteral("stopped while loading the data"));
    }

    void pauseAndResumeFromAnotherThread() {
        RecordingSink sink;
        Trainer trainer(small(), sink);
        std::atomic<int> microBatches{0};
        std::atomic<int> whilePaused{0};
        std::atomic<bool> paused{false};
        sink.onEach = [&](const Event& e) {
            if (std::holds_alternative<MicroBatchDone>(e)) {
                if (paused) ++whilePaused;
                if (++microBatches == 3) trainer.pause();
            }
            if (const auto* s = std::get_if<RunStateChanged>(&e)) {
                if (s->state == RunState::Paused)
                    paused = true;
                else if (paused)
                    paused = false;
            }
        };
        RunResult result;
        std::thread worker([&] { result = trainer.run(); });
        QTRY_VERIFY_WITH_TIMEOUT(paused.load(), 20000);
        // Paused right after the micro-batch that asked for it.
        QCOMPARE(microBatches.load(), 3);
        QTest::qWait(200);
        QCOMPARE(microBatches.load(), 3);
        trainer.resume();
        worker.join();
        QCOMPARE(whilePaused.load(), 0);
        QCOMPARE(result.state, RunState::Finished);
        QCOMPARE(result.steps, qint64(6));
    }

    void stopWhilePaused() {
        RecordingSink sink;
        Trainer trainer(small(), sink);
        sink.onEach = [&](const Event& e) {
            if (const auto* s = std::get_if<RunStateChanged>(&e); s && s->state == RunState::Paused) trainer.stop();
            if (std::holds_alternative<OptimizerStepped>(e)) trainer.pause();
        };
        const RunResult result = trainer.run();
        QVERIFY(result.stopped);
        QCOMPARE(result.steps, qint64(1));
    }

    void targetBatchChangeAppliesAtNextBatch() {
        RecordingSink sink;
        QCOMPARE(runChangingTargetAfterStep2(sink, 64), RunState::Finished);
        const auto steps = sink.all<StepMetrics>();
        QCOMPARE(steps[1].targetBatch, qint64(256));
        QCOMPARE(steps[2].targetBatch, qint64(64));
        QCOMPARE(steps[2].samplesSeen - steps[1].samplesSeen, qint64(64));
        const auto changes = sink.all<TargetBatchChanged>();
        QCOMPARE(changes.size(), size_t(1));
        QCOMPARE(changes.front().newLearningRate, changes.front().oldLearningRate * 0.25);
        QCOMPARE(steps[2].learningRate, changes.front().newLearningRate);
        const auto probes = sink.all<ProbeStarted>();
        QCOMPARE(probes.size(), size_t(2));
        QCOMPARE(probes[1].reason, ProbeReason::TargetBatchChange);
        QCOMPARE(probes[1].upperBound, qint64(64));
    }

    /// A change without a rule scales the learning rate by the run's TrainerOptions::lrScaling
    /// (a configuration file's "lr_scaling"): sqrt of 64/256 halves it.
    void targetBatchChangeUsesTheConfiguredRule() {
        RecordingSink sink;
        QCOMPARE(runChangingTargetAfterStep2(sink, 64, std::nullopt, LrScaling::Sqrt), RunState::Finished);
        const auto changes = sink.all<TargetBatchChanged>();
        QCOMPARE(changes.size(), size_t(1));
        QCOMPARE(changes.front().newLearningRate, changes.front().oldLearningRate * 0.5);
    }

    /// A target batch beyond the data (512 samples) is not capped silently: it is refused with a
    /// warning and training goes on at the target it had.
    void targetBatchLargerThanTheDataIsRefused() {
        RecordingSink sink;
        QCOMPARE(runChangingTargetAfterStep2(sink, 513), RunState::Finished);
        QVERIFY(sink.all<TargetBatchChanged>().empty());
        for (const auto& step : sink.all<StepMetrics>()) QCOMPARE(step.targetBatch, qint64(256));
        bool warned = false;
        for (const auto& w : sink.all<Warning>()) {
            warned = warned || QString::fromStdString(w.message).contains(
                                   QStringLiteral("target batch 513 ignored: the data has 512 samples"));
        }
        QVERIFY(warned);
    }

    void deviceSwitchGrowsMicroBatch_data() {
        QTest::addColumn<QString>("to");
        QTest::addColumn<int>("steps");
        QTest::newRow("exact") << QStringLiteral("virtual:128MiB/exact") << 6;
        // To PyTorch's caching allocator: a trial there is two micro-batches, and one of more than
        // half the target batch opens the next batch with its second, so the probe takes more
        // steps (measured: trials of 599 and 1198 samples in steps 3 and 5).
        QTest::newRow("to the caching allocator") << QStringLiteral("virtual:128MiB") << 12;
    }
    void deviceSwitchGrowsMicroBatch() {
        QFETCH(QString, to);
        QFETCH(int, steps);
        RecordingSink sink;
        TrainerOptions o = small();
        o.targetBatch = 2048;  // more than fits in 8 MiB
        o.data.samples = 4096;
        o.steps = steps;
        Trainer trainer(o, sink);
        sink.onEach = [&](const Event& e) {
            if (const auto* s = std::get_if<StepMetrics>(&e); s && s->step == 2) trainer.switchDevice(to.toStdString());
        };
        QCOMPARE(trainer.run().state, RunState::Finished);
        const auto switches = sink.all<DeviceSwitched>();
        QCOMPARE(switches.size(), size_t(1));
        QCOMPARE(switches.front().from, std::string("virtual:8MiB/exact"));
        QCOMPARE(switches.front().to, to.toStdString());
        const auto probes = sink.all<ProbeFinished>();
        QCOMPARE(probes.size(), size_t(2));
        QVERIFY2(probes[1].microBatch > probes[0].microBatch,
                 qPrintable(QStringLiteral("%1 → %2").arg(probes[0].microBatch).arg(probes[1].microBatch)));
        QVERIFY(probes[1].accumulationSteps < probes[0].accumulationSteps);
        QCOMPARE(sink.all<ProbeStarted>()[1].reason, ProbeReason::DeviceSwitch);
        const auto stepped = sink.all<StepMetrics>();
        QCOMPARE(stepped.size(), size_t(steps));
        QVERIFY(stepped.back().microBatch > stepped.front().microBatch);
    }

    void badDeviceSwitchIsIgnoredWithWarning() {
        RecordingSink sink;
        Trainer trainer(small(), sink);
        sink.onEach = [&](const Event& e) {
            if (const auto* s = std::get_if<StepMetrics>(&e); s && s->step == 1) {
                trainer.switchDevice("virtual:abc");
                trainer.switchDevice("virtual:1KiB");  // the later request replaces the earlier one
            }
        };
        QCOMPARE(trainer.run().state, RunState::Finished);
        QVERIFY(sink.all<DeviceSwitched>().empty());
        const auto warnings = sink.all<Warning>();
        QCOMPARE(warnings.size(), size_t(1));
        QVERIFY2(
            QString::fromStdString(warnings.front().message).contains(QStringLiteral("cannot switch to virtual:1KiB")),
            warnings.front().message.c_str());
    }

    void reprobeRunsNewSequence() {
        RecordingSink sink;
        Trainer trainer(small(), sink);
        sink.onEach = [&](const Event& e) {
            if (const auto* s = std::get_if<StepMetrics>(&e); s && s->step == 3) trainer.reprobe();
        };
        QCOMPARE(trainer.run().state, RunState::Finished);
        const auto probes = sink.all<ProbeFinished>();
        QCOMPARE(probes.size(), size_t(2));
        QCOMPARE(probes[1].sequence, 2);
        QCOMPARE(sink.all<ProbeStarted>()[1].reason, ProbeReason::UserRequest);
        // Same device, same memory: the same answer within the probe's tolerance.
        QVERIFY(std::abs(double(probes[1].microBatch - probes[0].microBatch)) <= 0.03 * double(probes[0].microBatch));
    }

    void regrowsAfterTransientOom() {
        installCountingAllocator();
        RecordingSink sink;
        TrainerOptions o = small();
        o.steps = 8;
        o.regrowAfterSteps = 2;
        // The failure is meant for training's step 3, not the validation after the first epoch
        // (step 2), which would take it first.
        o.validation.split = 0.0;
        Trainer trainer(o, sink);
        bool injected = false;
        sink.onEach = [&](const Event& e) {
            // Once training runs at the probed size, make one allocation fail (memory taken by
            // someone else for a moment).
            if (const auto* s = std::get_if<StepMetrics>(&e); s && s->step == 2 && !injected) {
                injected = true;
                CountingAllocator::instance().failAfter(5);
            }
        };
        QCOMPARE(trainer.run().state, RunState::Finished);
        const auto ooms = sink.all<OomEvent>();
        const auto shrink = std::find_if(ooms.begin(), ooms.end(), [](const OomEvent& e) { return e.step == 3; });
        QVERIFY(shrink != ooms.end());
        QVERIFY(shrink->recovered);
        QVERIFY(shrink->newMicroBatch < shrink->microBatch);
        const auto probes = sink.all<ProbeStarted>();
        QVERIFY(std::any_of(probes.begin(), probes.end(),
                            [](const ProbeStarted& p) { return p.reason == ProbeReason::Regrow; }));
        const auto finished = sink.all<ProbeFinished>();
        QVERIFY(finished.back().microBatch > shrink->newMicroBatch);
        QCOMPARE(sink.all<StepMetrics>().size(), size_t(8));
    }

    // Step mode: the run thread waits at every micro-batch for the window's thread (labelled
    // threads: the ThreadSanitizer stage runs these).
    void stepModeAdvancesOneMicroBatchPerCall() {
        TrainerOptions o = small();
        o.device = "virtual:64MiB/exact";
        o.targetBatch = 64;
        o.probe.maxMicroBatch = 16;
        o.stepMode = true;
        o.steps = 3;
        RecordingSink sink;
        Trainer trainer(o, sink);
        RunResult result;
        std::thread worker([&] { result = trainer.run(); });
        const auto count = [&](auto type) { return int(sink.all<decltype(type)>().size()); };
        // Waits before the first micro-batch, and stays there.
        QTRY_COMPARE_WITH_TIMEOUT(count(StepModeWaiting{}), 1, 30000);
        QTest::qWait(200);
        QCOMPARE(count(MicroBatchDone{}), 0);
        for (int click = 1; click <= 3; ++click) {
            trainer.advance();
            QTRY_COMPARE_WITH_TIMEOUT(count(StepModeWaiting{}), click + 1, 30000);
            QCOMPARE(count(MicroBatchDone{}), click);
        }
        const auto done = sink.all<MicroBatchDone>();
        for (const auto& d : done) {
            QCOMPARE(int64_t(d.sampleIndices.size()), d.size);  // which samples were used
            QCOMPARE(d.lossWeight, double(d.size) / 64.0);
            QVERIFY(d.gradientNorm > 0);
        }
        const StepModeWaiting next = sink.all<StepModeWaiting>().back();
        QCOMPARE(next.index, int64_t{3});
        QCOMPARE(next.offset, done[0].size + done[1].size + done[2].size);
        QCOMPARE(count(OptimizerStepped{}), 0);

        // Finish batch: the rest of step 1 and its optimizer step, then wait at step 2.
        trainer.finishBatch();
        QTRY_COMPARE_WITH_TIMEOUT(count(OptimizerStepped{}), 1, 30000);
        QTRY_VERIFY_WITH_TIMEOUT(sink.all<StepModeWaiting>().back().step == 2, 30000);
        QCOMPARE(sink.all<StepModeWaiting>().back().index, int64_t{0});
        int64_t samples = 0;
        for (const auto& d : sink.all<MicroBatchDone>()) samples += d.size;
        QCOMPARE(samples, int64_t{64});

        // Turning step mode off lets the run finish by itself.
        trainer.setStepMode(false);
        worker.join();
        QCOMPARE(result.state, RunState::Finished);
        QCOMPARE(result.steps, int64_t{3});
    }

    void stopWhileWaitingEndsTheRun() {
        TrainerOptions o = small();
        o.stepMode = true;
        RecordingSink sink;
        Trainer trainer(o, sink);
        RunResult result;
        std::thread worker([&] { result = trainer.run(); });
        QTRY_COMPARE_WITH_TIMEOUT(int(sink.all<StepModeWaiting>().size()), 1, 30000);
        trainer.stop();
        worker.join();
        QVERIFY(result.stopped);
        QCOMPARE(result.steps, int64_t{0});
        QCOMPARE(int(sink.all<MicroBatchDone>().size()), 0);
    }
};

}  // namespace tst_trainer_commands

BATCHPILOT_TEST_MAIN(tst_trainer_commands::TestTrainerCommands)
#include "tst_trainer_commands.moc"
