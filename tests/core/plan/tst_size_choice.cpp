#include <QtTest>
#include "tests/test_main.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "core/plan/size_choice.h"

namespace tst_size_choice {

using namespace batchpilot::core;

// The trainer's size-choosing state machine on its own, without a device: each expectation worked
// out by hand from what the user guide promises (a trial is decided by a second micro-batch where
// the allocator caches; a new probe ends a timing; the per-batch claim waits for a measured batch;
// a drift in speed times the sizes again from the size in use).
class TestSizeChoice : public QObject {
    Q_OBJECT

    static ProbeOptions largest() {
        ProbeOptions o;
        o.objective = ProbeObjective::Largest;
        return o;
    }
    // Runs the probe with a device that fits up to `fits` samples at 10 bytes each (usable 1000),
    // each trial decided at once (nothing cached): returns what it found.
    static int64_t probeUpTo(SizeChoice& c, int64_t fits) {
        while (std::optional<int64_t> size = c.probe().next()) {
            if (*size <= fits) {
                if (!c.trialFit(*size, 10 * *size, 0.01, /*cacheHeld=*/false, 0)) {
                    QTest::qFail("a trial without a cache was not decided at once", __FILE__, __LINE__);
                    return -1;
                }
            } else {
                c.trialOutOfMemory(*size, 1000, 64, 0.01, 0);
            }
        }
        return c.probe().result();
    }
    // Times the sizes up to `largest` where sizes below `fastBelow` run 1.5 times as fast as the
    // others, until the search decides (fails after 500 timings).
    static bool timeUntilDecided(SizeChoice& c, int64_t fastBelow) {
        for (int timings = 0; !c.timingDone(); ++timings) {
            if (timings == 500) return false;
            const int64_t size = c.plannedMicroBatch();
            const double speed = size < fastBelow ? 1500.0 : 1000.0;
            c.recordTiming(size, static_cast<double>(size) / speed, 0);
        }
        return true;
    }

    // The probe finds 64 (of 256), and the search, where sizes below 64 run 1.5 times as fast,
    // decides for one of them: the check on whole batches is due. Returns the size it chose.
    static int64_t decideBelowTheLargest(SizeChoice& c, const ProbeOptions& options) {
        c.startProbe(ProbeReason::Initial, options, 256, 1000, 1, 0, SizeChoice::Clock::now());
        probeUpTo(c, 64);
        c.finishProbe(256, 0, SizeChoice::Clock::now());
        if (c.startTiming(options, 64, 256, 64, SizeChoice::Clock::now()) || !timeUntilDecided(c, 64)) return 0;
        return c.search().chosen();
    }
    // Trains whole batches of 256 samples at the sizes a check on whole batches asks for, at
    // `gain` times the largest's speed for a size below it, on a machine that gets 1% slower with
    // every batch (a drift the turns cancel), until the check is done (fails after 500 batches).
    // Returns the number of batches of each size; the turns' events in `turns`.
    static std::map<int64_t, int> trainBatchesUntilChecked(SizeChoice& c, double gain, int64_t largest,
                                                           std::vector<ThroughputChecked>* turns = nullptr) {
        std::map<int64_t, int> batches;
        double machine = 1.0;
        for (int batch = 0; c.checking(); ++batch) {
            if (batch == 500) return {};
            const int64_t size = c.plannedMicroBatch();
            SizeChoice::BatchPlan plan;
            const SizeChoice::Next first = c.next(plan, 256);
            // The whole batch at that size: an even split, no part above it.
            int64_t planned = 0;
            for (const int64_t part : plan.sizes) planned += part;
            if (first.size != size || planned != 256 ||
                *std::max_element(plan.sizes.begin(), plan.sizes.end()) != size) {
                return {};
            }
            const double rate = 1000.0 * machine * (size == largest ? 1.0 : gain);
            if (c.recordBatch(size == largest ? 17 : largest, 1e6, 1e-3, 0.0))  // not the batch it asked for
                return {};
            const std::optional<ThroughputChecked> turn = c.recordBatch(size, rate, 256 / rate, batch);
            if (turn && turns) turns->push_back(*turn);
            ++batches[size];
            machine *= 0.99;
        }
        return batches;
    }
private Q_SLOTS:
    void aTrialIsDecidedByASecondMicroBatchWhereTheAllocatorCaches() {
        SizeChoice c;
        c.startProbe(ProbeReason::Initial, largest(), 64, 1000, 8, 0, SizeChoice::Clock::now());
        QCOMPARE(c.sequence(), 1);
        const int64_t size = *c.probe().next();
        QCOMPARE(size, int64_t{8});
        // The first micro-batch fit and left a cache: undecided, the second is due.
        QVERIFY(!c.trialFit(size, 600, 0.25, /*cacheHeld=*/true, 1.0));
        QCOMPARE(c.repeatDue(), std::optional<int64_t>(8));
        QVERIFY(c.isRepeat(8));
        QCOMPARE(c.probe().trials(), 0);
        // The second decides: the higher of the two peaks, both micro-batches' time, one trial.
        const std::optional<ProbeTrial> t = c.trialFit(size, 700, 0.5, /*cacheHeld=*/true, 2.0);
        QVERIFY(t);
        QCOMPARE(t->microBatch, int64_t{8});
        QVERIFY(t->fit);
        QVERIFY(t->withinHeadroom);
        QCOMPARE(t->peakBytes, int64_t{700});
        QCOMPARE(t->seconds, 0.75);
        QCOMPARE(t->trial, 1);
        QCOMPARE(t->sequence, 1);
        QCOMPARE(c.probe().trials(), 1);
        QVERIFY(!c.repeatDue());

        // Nothing cached (exact counting, the CPU): decided by the first.
        const int64_t next = *c.probe().next();
        QVERIFY(c.trialFit(next, 800, 0.1, /*cacheHeld=*/false, 3.0));
        // A first micro-batch beyond the usable bytes is decided at once, outside the headroom.
        const int64_t third = *c.probe().next();
        const std::optional<ProbeTrial> over = c.trialFit(third, 1200, 0.1, /*cacheHeld=*/true, 4.0);
        QVERIFY(over);
        QVERIFY(!over->withinHeadroom);
        QCOMPARE(c.probe().trials(), 3);
    }

    void aSecondMicroBatchThatRunsOutOfMemoryIsAFailedTrial() {
        SizeChoice c;
        c.startProbe(ProbeReason::Initial, largest(), 64, 1000, 16, 0, SizeChoice::Clock::now());
        const int64_t size = *c.probe().next();
        QVERIFY(!c.trialFit(size, 900, 0.1, true, 0));
        const ProbeTrial failed = c.trialOutOfMemory(size, 990, 128, 0.05, 1.0);
        QVERIFY(!failed.fit);
        QCOMPARE(failed.failedAllocationBytes, int64_t{128});
        QCOMPARE(failed.trial, 1);
        QVERIFY(!c.repeatDue());
        QVERIFY(*c.probe().next() < size);  // the probe went down
    }

    void aFinishedProbeReportsItsSizeAndPlanAndWhetherTheSettingIsNew() {
        SizeChoice c;
        c.startProbe(ProbeReason::Initial, largest(), 100, 1000, 1, 0, SizeChoice::Clock::now());
        QCOMPARE(probeUpTo(c, 30), int64_t{30});
        const SizeChoice::ProbeEnd end = c.finishProbe(100, 5.0, SizeChoice::Clock::now());
        QCOMPARE(end.finished.microBatch, int64_t{30});
        QCOMPARE(end.finished.accumulationSteps, int64_t{4});  // 100 = 25 + 25 + 25 + 25
        QCOMPARE(end.finished.targetBatch, int64_t{100});
        QCOMPARE(end.finished.sequence, 1);
        QVERIFY(end.newSetting);
        QVERIFY(end.lastFit > 0 && end.lastFit <= 30);
        QCOMPARE(c.sizes().microBatch, int64_t{30});
        QCOMPARE(c.sizes().probed, int64_t{30});
        QVERIFY(!c.probing());
        QVERIFY(c.settled());  // the largest objective: nothing to time
        QVERIFY(!c.startTiming(largest(), 30, 100, end.lastFit, SizeChoice::Clock::now()));
        QVERIFY(!c.timing());

        // A regrow is not a new setting (no memory-saver survey after it).
        c.startProbe(ProbeReason::Regrow, largest(), 100, 1000, 30, 30, SizeChoice::Clock::now());
        QCOMPARE(c.sequence(), 2);
        QCOMPARE(c.currentSize(), int64_t{30});
        probeUpTo(c, 40);
        QVERIFY(!c.finishProbe(100, 6.0, SizeChoice::Clock::now()).newSetting);
    }

    void aNewProbeEndsTheTimingAndTheRunEndsAProbe() {
        SizeChoice c;
        c.startProbe(ProbeReason::Initial, ProbeOptions{}, 256, 1000, 1, 0, SizeChoice::Clock::now());
        probeUpTo(c, 64);
        c.finishProbe(256, 1.0, SizeChoice::Clock::now());
        QVERIFY(!c.startTiming(ProbeOptions{}, 64, 256, 64, SizeChoice::Clock::now()));  // fastest
        QVERIFY(c.timing());
        QVERIFY(!c.settled());
        const int64_t timed = c.plannedMicroBatch();
        QVERIFY(timed >= 1 && timed <= 64);
        c.startProbe(ProbeReason::UserRequest, ProbeOptions{}, 256, 1000, 1, 0, SizeChoice::Clock::now());
        QVERIFY(!c.timing());
        QVERIFY(c.probing());
        QCOMPARE(c.plannedMicroBatch(), int64_t{64});  // the size in use until the probe decides
        c.abandonProbe();
        QVERIFY(c.settled());
        QCOMPARE(c.currentSize(), int64_t{64});
    }

    // Sizes below 64 run 1.5 times as fast as 64 itself: the timing must choose a smaller size,
    // claim about 1.5 for the micro-batches, and claim less per whole batch once a batch's other
    // costs were measured (0.2 s per batch besides the micro-batches).
    void theDecisionClaimsPerBatchOnlyOnceABatchWasMeasured() {
        for (const bool measured : {false, true}) {
            SizeChoice c;
            c.startProbe(ProbeReason::Initial, ProbeOptions{}, 256, 1000, 1, 0, SizeChoice::Clock::now());
            probeUpTo(c, 64);
            c.finishProbe(256, 0, SizeChoice::Clock::now());
            if (measured) c.stepCosts.observe(4, 1.0, 1.0, 1.2);
            QVERIFY(!c.startTiming(ProbeOptions{}, 64, 256, 64, SizeChoice::Clock::now()));
            // A size other than the one being timed is not counted.
            const int64_t other = c.plannedMicroBatch() == 64 ? 32 : 64;
            QVERIFY(!c.recordTiming(other, 1.0, 0));
            QVERIFY2(timeUntilDecided(c, 64), "the timing never decided");
            const ThroughputChosen chosen =
                c.finishTiming(c.search().chosen(), 256, ProbeOptions{}, 9.0, SizeChoice::Clock::now());
            QVERIFY(chosen.microBatch < 64);
            QCOMPARE(chosen.largestMicroBatch, int64_t{64});
            QCOMPARE(c.sizes().microBatch, chosen.microBatch);
            QCOMPARE(c.sizes().lastChosen, chosen.microBatch);
            QVERIFY2(std::abs(chosen.speedOverLargest - 1.5) < 0.05,
                     qPrintable(QString::number(chosen.speedOverLargest)));
            QVERIFY(c.settled());
            if (!measured) {
                QCOMPARE(chosen.stepSpeedOverLargest, 0.0);
                QVERIFY(!QString::fromStdString(chosen.reason).contains(QStringLiteral("per training batch")));
            } else {
                // 256 samples: 0.256 s at the largest + 0.2 s against 0.256 / 1.5 + 0.2.
                const double expected = (0.256 + 0.2) / (0.256 / 1.5 + 0.2);
                QVERIFY2(std::abs(chosen.stepSpeedOverLargest - expected) < 0.03,
                         qPrintable(QString::number(chosen.stepSpeedOverLargest)));
                QVERIFY(QString::fromStdString(chosen.reason)
                            .contains(QStringLiteral("per training batch, with its 200 ms")));
            }
        }
    }

    void theNextMicroBatchDuringAProbe() {
        SizeChoice c;
        c.requireTwoSamples(/*trial=*/true);  // a BatchNorm model: no part of one sample
        c.startProbe(ProbeReason::Initial, largest(), 64, 1000, 8, 0, SizeChoice::Clock::now());
        SizeChoice::BatchPlan plan;
        SizeChoice::Next n = c.next(plan, 64);
        QCOMPARE(n.kind, SizeChoice::Next::Kind::Train);
        QCOMPARE(n.size, int64_t{8});
        QVERIFY(n.trial);
        // 9 samples left: a trial of 8 would leave one, and nothing fit yet: all 9 as the trial.
        n = c.next(plan, 9);
        QCOMPARE(n.size, int64_t{9});
        QVERIFY(n.trial);
        // Once 8 fit: the 9 train as one untimed micro-batch at the size found, the trial waits.
        QVERIFY(c.trialFit(8, 80, 0.1, false, 0));
        const int64_t proposed = *c.probe().next();
        QVERIFY(proposed > 8);
        n = c.next(plan, proposed + 1);
        QVERIFY(!n.trial);
        const int64_t parts = (proposed + 1 + 7) / 8;  // split evenly at 8 at most
        QCOMPARE(n.size, (proposed + 1 + parts - 1) / parts);
        // A trial decided by a second micro-batch that would leave one sample: the batch's rest
        // trains untimed and the second micro-batch opens the next batch.
        QVERIFY(!c.trialFit(proposed, 10 * proposed, 0.1, /*cacheHeld=*/true, 0));
        n = c.next(plan, proposed + 1);
        QCOMPARE(n.size, proposed + 1);
        QVERIFY(!n.trial);
        n = c.next(plan, 64);
        QCOMPARE(n.size, proposed);
        QVERIFY(n.trial);
        c.trialOutOfMemory(proposed, 1000, 64, 0.1, 0);
        // Out of sizes: the probe is over.
        while (c.probe().next()) c.trialOutOfMemory(*c.probe().next(), 1000, 64, 0.1, 0);
        QCOMPARE(c.next(plan, 64).kind, SizeChoice::Next::Kind::ProbeOver);

        // Below the smallest micro-batch: nothing fits.
        SizeChoice none;
        none.requireTwoSamples(/*trial=*/true);
        none.startProbe(ProbeReason::Initial, largest(), 64, 1000, 2, 0, SizeChoice::Clock::now());
        while (true) {
            const SizeChoice::Next step = none.next(plan, 64);
            if (step.kind != SizeChoice::Next::Kind::Train) {
                QCOMPARE(step.kind, SizeChoice::Next::Kind::NothingFits);
                break;
            }
            QVERIFY(step.size >= 2);
            none.trialOutOfMemory(step.size, 1000, 64, 0.1, 0);
        }
    }

    void aSizeBelowTheLargestIsKeptOnlyWhenWholeBatchesShowItFaster() {
        // The micro-batches say 1.5 times as fast; whole batches then say 1.2 (kept, and that is
        // the claim) or 0.98 (the largest is kept after all).
        for (const double gain : {1.2, 0.98}) {
            ProbeOptions options;
            options.checkSeconds = 10;
            SizeChoice c;
            c.stepCosts.observe(4, 1.0, 1.0, 1.2);
            const int64_t searched = decideBelowTheLargest(c, options);
            QVERIFY2(searched > 0 && searched < 64, qPrintable(QString::number(searched)));
            QVERIFY(c.startBatchCheck(options));
            QVERIFY(c.checking());
            QVERIFY(!c.timingDone());
            QVERIFY(!c.settled());
            QVERIFY(!c.startBatchCheck(options));  // one check per decision
            std::vector<ThroughputChecked> turns;
            const std::map<int64_t, int> batches = trainBatchesUntilChecked(c, gain, 64, &turns);
            QVERIFY2(!batches.empty(), "a batch was not planned whole at the size the check asked for");
            QVERIFY(c.timingDone());
            // Nine turns and the warm-up of the largest; the first batch (256 samples at 1000 ×
            // gain samples/s) sets the period: 1 s a turn (10 s over nine turns and the warm-up),
            // as many batches as take 1 s, less the largest's — 4 of the chosen size (1.2) or 3
            // (0.98) between two of the largest, as many before the warm-up and 1 after the last.
            const int period = gain > 1 ? 4 : 3;
            QCOMPARE(batches.at(64), 10);
            QCOMPARE(batches.at(searched), period + 9 * period + 1);
            const ThroughputChosen chosen = c.finishTiming(searched, 256, options, 9.0, SizeChoice::Clock::now());
            QVERIFY(c.settled());
            QCOMPARE(chosen.largestMicroBatch, int64_t{64});
            QCOMPARE(chosen.batchRatios.size(), size_t{9});
            for (const double ratio : chosen.batchRatios)
                QVERIFY2(std::abs(ratio - gain) < 1e-3, qPrintable(QString::number(ratio)));  // drift cancelled
            // Turns that agree (to 1e-3) pin the gain down after the fewest: its 95% interval is
            // that narrow, and the decision says so.
            QVERIFY(std::abs(chosen.batchGainLow - gain) < 1e-3 && std::abs(chosen.batchGainHigh - gain) < 1e-3);
            // Each turn was reported as it ended: numbered, with its ratio and the median so far.
            QCOMPARE(turns.size(), size_t{9});
            for (size_t i = 0; i < turns.size(); ++i) {
                QCOMPARE(turns[i].turn, static_cast<int>(i + 1));
                QCOMPARE(turns[i].microBatch, searched);
                QCOMPARE(turns[i].largestMicroBatch, int64_t{64});
                QCOMPARE(turns[i].ratio, chosen.batchRatios[i]);
                QVERIFY(std::abs(turns[i].gain - gain) < 1e-3);
                QVERIFY(turns[i].gainLow <= turns[i].gain && turns[i].gain <= turns[i].gainHigh);
            }
            QCOMPARE(turns.back().gainLow, chosen.batchGainLow);
            QVERIFY(chosen.batchGainLow <= chosen.stepSpeedOverLargest || gain < 1);
            const QString reason = QString::fromStdString(chosen.reason);
            QVERIFY2(reason.contains(QStringLiteral("9 turns of whole training batches")), qPrintable(reason));
            if (gain > 1) {
                QCOMPARE(chosen.microBatch, searched);
                QVERIFY2(std::abs(chosen.stepSpeedOverLargest - gain) < 1e-3,
                         qPrintable(QString::number(chosen.stepSpeedOverLargest)));
                QVERIFY2(std::abs(chosen.speedOverLargest - 1.5) < 0.05, "the micro-batches' own claim stays");
                QVERIFY2(reason.contains(QStringLiteral("it ran at 1.20x the largest's speed (95% interval 1.20x to "
                                                        "1.20x)")),
                         qPrintable(reason));
            } else {
                QCOMPARE(chosen.microBatch, int64_t{64});
                QCOMPARE(chosen.speedOverLargest, 1.0);
                QCOMPARE(chosen.stepSpeedOverLargest, 1.0);
                QVERIFY2(reason.contains(QStringLiteral("0.98x the largest's speed (95% interval 0.98x to 0.98x), no "
                                                        "faster: the largest (64) is kept")),
                         qPrintable(reason));
            }
            QCOMPARE(c.sizes().microBatch, chosen.microBatch);
            QCOMPARE(c.sizes().lastChosen, chosen.microBatch);
        }
    }

    void aCheckCutShortKeepsTheSearchsChoice() {
        // An OOM during the check (memory taken since the probe) keeps the search's choice, with
        // what the turns that ended measured; it overturns nothing, even where that is no gain.
        ProbeOptions options;
        options.checkSeconds = 6;
        for (const int turns : {0, 1}) {
            SizeChoice c;
            const int64_t searched = decideBelowTheLargest(c, options);
            QVERIFY2(searched > 0 && searched < 64, qPrintable(QString::number(searched)));
            QVERIFY(c.startBatchCheck(options));
            // Whole batches where the chosen size is no faster: the warm-up of the largest is its
            // first batch, the second opens a turn, the chosen size's next closes it.
            int largestBatches = 0;
            for (int batch = 0; batch < 100; ++batch) {
                const int64_t size = c.plannedMicroBatch();
                if (turns == 0 && size == 64) break;
                c.recordBatch(size, 1000, 0.256, 0.0);
                if (size == 64) ++largestBatches;
                if (turns == 1 && largestBatches == 2 && size == searched) break;
            }
            QVERIFY(c.checking());
            QCOMPARE(c.abandonTiming(64), searched);
            const ThroughputChosen chosen = c.finishTiming(searched, 256, options, 9.0, SizeChoice::Clock::now());
            QCOMPARE(chosen.microBatch, searched);
            QCOMPARE(chosen.batchRatios.size(), size_t(turns));
            const QString reason = QString::fromStdString(chosen.reason);
            QVERIFY2(reason.contains(QStringLiteral("the check on whole training batches was cut short (an "
                                                    "out-of-memory error interrupted it)")),
                     qPrintable(reason));
            if (turns == 0) {
                QVERIFY2(reason.contains(QStringLiteral("before its first turn")), qPrintable(reason));
            } else {
                QVERIFY2(reason.contains(QStringLiteral("after 1 turn of whole training batches")), qPrintable(reason));
                QCOMPARE(chosen.stepSpeedOverLargest, 1.0);
            }
            QVERIFY(c.settled());
        }
        // A new probe (a device switch, a target change, …) ends a check: the sizes are timed
        // again after it.
        SizeChoice c;
        QVERIFY(decideBelowTheLargest(c, options) > 0);
        QVERIFY(c.startBatchCheck(options));
        c.startProbe(ProbeReason::DeviceSwitch, options, 256, 1000, 1, 0, SizeChoice::Clock::now());
        QVERIFY(!c.checking());
        QVERIFY(!c.timing());
        // And a check is not wanted at all with checkSeconds 0, nor for the largest.
        ProbeOptions unchecked = options;
        unchecked.checkSeconds = 0;
        probeUpTo(c, 64);
        c.finishProbe(256, 0, SizeChoice::Clock::now());
        QVERIFY(!c.startTiming(unchecked, 64, 256, 64, SizeChoice::Clock::now()));
        QVERIFY(timeUntilDecided(c, 64));
        QVERIFY(!c.startBatchCheck(unchecked));
        QVERIFY(c.timingDone());
        c.finishTiming(c.search().chosen(), 256, unchecked, 9.0, SizeChoice::Clock::now());
        QVERIFY(!c.startTiming(options, 64, 256, 64, SizeChoice::Clock::now()));
        QVERIFY(timeUntilDecided(c, 0));  // every size as fast: the largest
        QCOMPARE(c.search().chosen(), int64_t{64});
        QVERIFY(!c.startBatchCheck(options));
    }

    void theNextMicroBatchWhileTimingAndSettled() {
        SizeChoice c;
        c.startProbe(ProbeReason::Initial, ProbeOptions{}, 256, 1000, 1, 0, SizeChoice::Clock::now());
        probeUpTo(c, 64);
        c.finishProbe(256, 0, SizeChoice::Clock::now());
        QVERIFY(!c.startTiming(ProbeOptions{}, 64, 256, 64, SizeChoice::Clock::now()));
        const int64_t timed = c.plannedMicroBatch();
        SizeChoice::BatchPlan plan;
        // The timed size exactly, then the rest split evenly at it.
        SizeChoice::Next n = c.next(plan, 100);
        QCOMPARE(n.size, timed);
        QCOMPARE(plan.sizes.front(), timed);
        int64_t planned = 0;
        for (int64_t s : plan.sizes) planned += s;
        QCOMPARE(planned, int64_t{100});
        // An end of the batch shorter than the timed size trains untimed, as one part.
        n = c.next(plan, timed - 1);
        QVERIFY(!n.trial);
        QCOMPARE(n.size, timed - 1);
        QVERIFY(timeUntilDecided(c, 0));
        c.finishTiming(c.search().chosen(), 256, ProbeOptions{}, 0, SizeChoice::Clock::now());

        // Settled: one even plan for the batch, kept while the size stays.
        c.resumeAt(40);
        plan = {};
        n = c.next(plan, 100);
        QCOMPARE(plan.sizes, (std::vector<int64_t>{34, 33, 33}));
        QCOMPARE(n.size, int64_t{34});
        plan.sizes.erase(plan.sizes.begin());  // the trainer, after it trained
        QCOMPARE(c.next(plan, 66).size, int64_t{33});
        QCOMPARE(c.shrinkAfterOom(40), std::optional<int64_t>(20));  // an OOM shrink: planned anew
        QCOMPARE(c.next(plan, 66).size, int64_t{17});
        QCOMPARE(plan.sizes, (std::vector<int64_t>{17, 17, 16, 16}));
    }

    void aDriftInSpeedTimesTheSizesAgainFromTheSizeInUse() {
        ProbeOptions options;
        options.objective = ProbeObjective::Largest;
        options.retimeEvery = 2;
        options.retimeDrift = 0.1;
        SizeChoice c;
        c.startProbe(ProbeReason::Initial, options, 256, 1000, 1, 0, SizeChoice::Clock::now());
        probeUpTo(c, 40);
        c.finishProbe(256, 0, SizeChoice::Clock::now());
        QVERIFY(!c.watchSpeed(100));  // no decision yet: nothing watched
        // A decision starts the watch (every size equally fast: the largest, or the even split of
        // the target with as many micro-batches, 37 for 256 = 6 × 37 + 34).
        ProbeOptions fastest = options;
        fastest.objective = ProbeObjective::Fastest;
        QVERIFY(!c.startTiming(fastest, 40, 256, 40, SizeChoice::Clock::now()));
        QVERIFY(timeUntilDecided(c, 0));
        const int64_t chosen =
            c.finishTiming(c.search().chosen(), 256, options, 0, SizeChoice::Clock::now()).microBatch;
        QVERIFY2(chosen == 40 || chosen == 37, qPrintable(QString::number(chosen)));
        QCOMPARE(c.sizes().microBatch, chosen);
        QVERIFY(!c.watchSpeed(100));
        QVERIFY(!c.watchSpeed(100));  // the baseline
        QVERIFY(!c.watchSpeed(105));
        QVERIFY(!c.watchSpeed(105));                                     // within 10%
        const std::optional<int64_t> shrunk = c.shrinkAfterOom(chosen);  // an OOM shrink since: the size in use
        QVERIFY(shrunk);
        QVERIFY(!c.watchSpeed(60));
        const std::optional<std::string> why = c.watchSpeed(60);
        QVERIFY(why);
        QVERIFY2(QString::fromStdString(*why).contains(QStringLiteral("-40%")), why->c_str());
        QCOMPARE(c.sizes().lastChosen, *shrunk);  // the next timing starts from it
        c.stopWatchingSpeed();
        QVERIFY(!c.watchSpeed(10));
        QVERIFY(!c.watchSpeed(10));
    }
};

}  // namespace tst_size_choice

BATCHPILOT_TEST_MAIN(tst_size_choice::TestSizeChoice)
#include "tst_size_choice.moc"
