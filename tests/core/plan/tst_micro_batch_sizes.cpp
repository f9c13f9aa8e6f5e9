#include <QtTest>
#include "tests/test_main.h"

#include <optional>
#include <vector>

#include "core/plan/micro_batch_sizes.h"

namespace tst_micro_batch_sizes {

using namespace batchpilot::core;

// The trainer's size decisions on their own: each expectation worked out by hand from the rules
// the user guide states (an OOM halves the micro-batch, never below the model's smallest; a
// single sample is retried twice; after regrow_after_steps clean steps a probe looks up again).
class TestMicroBatchSizes : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void anOomHalvesDownToTheSmallestAllowed() {
        MicroBatchSizes s;
        s.probeFound(64);
        std::vector<int64_t> seen;
        std::optional<int64_t> next = s.shrinkAfterOom(64);
        while (next) {
            seen.push_back(*next);
            next = s.shrinkAfterOom(*next);
        }
        QCOMPARE(seen, (std::vector<int64_t>{32, 16, 8, 4, 2, 1}));
        QCOMPARE(s.microBatch, int64_t{1});
        QCOMPARE(s.probed, int64_t{64});  // what a regrow probes up to

        // BatchNorm: nothing below 2. A short last part of 3 still shrinks while the size in use
        // is above 2; at 2 itself nothing smaller is left.
        MicroBatchSizes batchNorm;
        batchNorm.requireTwoSamples();
        QCOMPARE(batchNorm.minMicroBatch, int64_t{2});
        QCOMPARE(batchNorm.minPart, int64_t{2});
        batchNorm.probeFound(8);
        QCOMPARE(batchNorm.shrinkAfterOom(3), std::optional<int64_t>(2));
        QCOMPARE(batchNorm.shrinkAfterOom(2), std::optional<int64_t>());
        QCOMPARE(batchNorm.microBatch, int64_t{2});
    }

    void aSingleSampleIsRetriedTwice() {
        MicroBatchSizes s;
        QVERIFY(!s.retrySingleSample(2));  // only a single sample
        QVERIFY(s.retrySingleSample(1));
        QVERIFY(s.retrySingleSample(1));
        QVERIFY(!s.retrySingleSample(1));  // the third OOM in a row: the model does not fit
        s.succeeded();
        QVERIFY(s.retrySingleSample(1));
    }

    void aRegrowComesAfterCleanSteps() {
        MicroBatchSizes s;
        s.probeFound(40);
        QVERIFY(!s.cleanStep(3));  // no shrink: nothing to regrow
        QVERIFY(!s.cleanStep(3));
        QVERIFY(!s.cleanStep(3));
        QCOMPARE(s.shrinkAfterOom(40), std::optional<int64_t>(20));
        QVERIFY(!s.cleanStep(3));
        QVERIFY(!s.cleanStep(3));
        QVERIFY(s.cleanStep(3));   // the third clean step: probe up to 40 again
        QVERIFY(!s.cleanStep(3));  // once
        QCOMPARE(s.shrinkAfterOom(20), std::optional<int64_t>(10));
        QVERIFY(!s.cleanStep(0));  // regrow_after_steps 0: never
        QVERIFY(!s.cleanStep(0));
        s.probeFound(10);  // the probe itself found no more
        QCOMPARE(s.shrinkAfterOom(10), std::optional<int64_t>(5));
        s.probed = 5;
        QVERIFY(!s.cleanStep(1));  // nothing larger to find
    }

    void retriesInTwoSettledStepsInARowAreThrashing() {
        // Composer's rule: two consecutive steps with allocator retries at a settled size.
        MicroBatchSizes s;
        s.probeFound(64);
        QVERIFY(!s.thrashing(3, true));  // one step with retries
        QVERIFY(!s.thrashing(0, true));  // a clean step in between starts the count again
        QVERIFY(!s.thrashing(1, true));
        QVERIFY(s.thrashing(2, true));    // the second in a row
        QVERIFY(!s.thrashing(1, true));   // the count started again after the decision
        QVERIFY(!s.thrashing(5, false));  // during a probe or a timing retries are expected
        QVERIFY(!s.thrashing(5, true));
        // What the trainer does then: shrink as after an OOM, a regrow pending.
        QCOMPARE(s.shrinkAfterOom(s.microBatch), std::optional<int64_t>(32));
    }

    void theRestOfABatchIsSplitEvenly() {
        MicroBatchSizes s;
        QCOMPARE(s.planFor(10, 4), (std::vector<int64_t>{4, 3, 3}));  // 3 parts, as even as can be
        QCOMPARE(s.planFor(8, 8), (std::vector<int64_t>{8}));
        QCOMPARE(s.planFor(5, 2), (std::vector<int64_t>{2, 2, 1}));
        s.requireTwoSamples();  // a last part of one sample joins the one before it
        QCOMPARE(s.planFor(5, 2), (std::vector<int64_t>{2, 3}));
    }
};

}  // namespace tst_micro_batch_sizes

BATCHPILOT_TEST_MAIN(tst_micro_batch_sizes::TestMicroBatchSizes)
#include "tst_micro_batch_sizes.moc"
