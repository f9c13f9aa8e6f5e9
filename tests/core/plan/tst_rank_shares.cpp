// Splitting training batches between the ranks of a data-parallel job: the shares add up, follow
// the weights, cover every sample of an epoch exactly once, and the balancer moves them towards
// the measured speeds.

#include <QtTest>

#include <algorithm>
#include <numeric>
#include <set>

#include "core/plan/rank_shares.h"
#include "core/data/sampler.h"

using namespace batchpilot::core;

class TestRankShares : public QObject {
    Q_OBJECT

private Q_SLOTS:
    void sharesAddUpAndFollowWeights_data() {
        QTest::addColumn<qint64>("total");
        QTest::addColumn<std::vector<double>>("weights");
        QTest::addColumn<qint64>("minShare");
        QTest::addColumn<std::vector<int64_t>>("expected");
        // Worked out by hand: 1024 * 48/240 = 204.8 and 1024 * 192/240 = 819.2.
        QTest::newRow("1:4 memory") << qint64(1024) << std::vector<double>{48, 192} << qint64(1)
                                    << std::vector<int64_t>{205, 819};
        QTest::newRow("equal, odd total")
            << qint64(7) << std::vector<double>{1, 1} << qint64(1) << std::vector<int64_t>{4, 3};
        QTest::newRow("three ranks") << qint64(100) << std::vector<double>{1, 2, 3} << qint64(1)
                                     << std::vector<int64_t>{17, 33, 50};
        // 10 * 1/1000 rounds to 0, lifted to the minimum of 2, taken from the largest.
        QTest::newRow("minimum lifted") << qint64(10) << std::vector<double>{1, 999} << qint64(2)
                                        << std::vector<int64_t>{2, 8};
        QTest::newRow("no weight known") << qint64(9) << std::vector<double>{0, 0, 0} << qint64(1)
                                         << std::vector<int64_t>{3, 3, 3};
        // An unknown (0) weight counts as the smallest known one: {1, 1, 2}.
        QTest::newRow("one weight unknown")
            << qint64(8) << std::vector<double>{0, 1, 2} << qint64(1) << std::vector<int64_t>{2, 2, 4};
        // Fewer samples than the minimums: the first ranks get them, the rest join the last one.
        QTest::newRow("short for BatchNorm")
            << qint64(3) << std::vector<double>{1, 1} << qint64(2) << std::vector<int64_t>{3, 0};
        QTest::newRow("one sample, three ranks")
            << qint64(1) << std::vector<double>{1, 1, 1} << qint64(1) << std::vector<int64_t>{1, 0, 0};
    }
    void sharesAddUpAndFollowWeights() {
        QFETCH(qint64, total);
        QFETCH(std::vector<double>, weights);
        QFETCH(qint64, minShare);
        QFETCH(std::vector<int64_t>, expected);
        const std::vector<int64_t> shares = splitShares(total, weights, minShare);
        QCOMPARE(shares, expected);
        QCOMPARE(std::accumulate(shares.begin(), shares.end(), int64_t{0}), int64_t(total));
    }

    void shortBatchKeepsProportions() {
        // The end of an epoch: 100 samples left of a 1024 batch shared 205 + 819.
        QCOMPARE(scaleShares({205, 819}, 100, 1), (std::vector<int64_t>{20, 80}));
        QCOMPARE(shareOffset({20, 80}, 0), int64_t{0});
        QCOMPARE(shareOffset({20, 80}, 1), int64_t{20});
    }

    void everySampleOnceAcrossRanksPerEpoch() {
        // Two epochs of 1000 samples at target 96 (the last batch of each epoch is 40 long), the
        // shares changing in between as the balancer would change them: every sample is trained
        // by exactly one rank, once per epoch.
        constexpr int64_t kSamples = 1000;
        constexpr int64_t kTarget = 96;
        Sampler sampler(kSamples, 7);
        std::vector<std::vector<int64_t>> shareSequence{{19, 77}, {48, 48}, {60, 36}};
        for (int64_t epoch = 0; epoch < 2; ++epoch) {
            std::vector<int> seen(kSamples, 0);
            int batch = 0;
            while (sampler.completedEpochs() == epoch) {
                const std::vector<int64_t> indices = sampler.next(kTarget);
                const auto total = static_cast<int64_t>(indices.size());
                const std::vector<int64_t>& full = shareSequence[static_cast<size_t>(batch++ % 3)];
                const std::vector<int64_t> shares = total == kTarget ? full : scaleShares(full, total, 1);
                QCOMPARE(std::accumulate(shares.begin(), shares.end(), int64_t{0}), total);
                for (int rank = 0; rank < 2; ++rank) {
                    const int64_t offset = shareOffset(shares, rank);
                    for (int64_t i = offset; i < offset + shares[static_cast<size_t>(rank)]; ++i)
                        ++seen[static_cast<size_t>(indices[static_cast<size_t>(i)])];
                }
            }
            QVERIFY(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
        }
    }

    void balancerMovesSharesToEqualSpeeds() {
        // Two ranks that compute equally fast per sample, started 1:4 (by memory): after the
        // settled steps it waits for, the shares become equal and stay there.
        ShareBalancer balancer({});
        std::vector<int64_t> shares{205, 819};
        std::optional<ShareBalancer::Change> change;
        for (int step = 0; step < 3 && !change; ++step) {
            const double perSample = 0.001;
            change = balancer.observe(
                {{shares[0], shares[0] * perSample, true}, {shares[1], shares[1] * perSample, true}}, shares, 1024);
            if (step < 2) QVERIFY(!change);  // it measures stepsBetween (3) settled steps first
        }
        QVERIFY(change);
        QCOMPARE(change->shares, (std::vector<int64_t>{512, 512}));
        QVERIFY(change->reason.find("300%") != std::string::npos);  // 819 / 205 - 1
        shares = change->shares;
        for (int step = 0; step < 6; ++step) {
            QVERIFY(!balancer.observe({{512, 0.512, true}, {512, 0.52, true}}, shares, 1024));  // within 10%
        }
    }

    void balancerFollowsUnequalSpeedsAndIgnoresProbing() {
        // Rank 1 computes 3x as fast as rank 0: its share becomes 3/4 of the batch. Steps in
        // which a rank probes or times sizes are not measured and restart the count.
        ShareBalancer balancer({});
        const std::vector<int64_t> shares{50, 50};
        QVERIFY(!balancer.observe({{50, 0.3, true}, {50, 0.1, false}}, shares, 100));
        QVERIFY(!balancer.observe({{50, 0.3, true}, {50, 0.1, true}}, shares, 100));
        QVERIFY(!balancer.observe({{50, 0.3, true}, {50, 0.1, true}}, shares, 100));
        const auto change = balancer.observe({{50, 0.3, true}, {50, 0.1, true}}, shares, 100);
        QVERIFY(change);
        QCOMPARE(change->shares, (std::vector<int64_t>{25, 75}));
        QCOMPARE(balancer.lastImbalance(), 3.0);
    }

    /// NCCL only where it works: every rank on a GPU of its own, each able to use it; anything
    /// else is summed by Gloo, with the reason a user can act on.
    void ncclOnlyForRanksOnGpusOfTheirOwn() {
        const auto choose = [](std::vector<std::string> devices, std::vector<std::string> places) {
            return chooseCollectives(devices, places);
        };
        QVERIFY(choose({"cuda:0", "cuda:1"}, {"a", "a"}).nccl);
        QVERIFY(choose({"cuda:0", "cuda:0"}, {"a", "b"}).nccl);  // the same index on two machines
        const CollectivesChoice shared = choose({"cuda:0", "cuda:1", "cuda:1"}, {"a", "a", "a"});
        QVERIFY(!shared.nccl);
        QCOMPARE(shared.why, std::string("rank 1 (cuda:1) and rank 2 share a GPU of a, which NCCL refuses"));
        const CollectivesChoice host = choose({"cuda:0", "virtual:48MiB"}, {"a", "a"});
        QVERIFY(!host.nccl);
        QCOMPARE(host.why, std::string("rank 1 (virtual:48MiB) is not on a GPU"));
        const CollectivesChoice without = choose({"cuda:0", "cuda:1"}, {"a", ""});
        QVERIFY(!without.nccl);
        QVERIFY2(without.why.find("rank 1 (cuda:1) has no NCCL") == 0, without.why.c_str());
        QVERIFY(!choose({"cuda:0", "cuda:1"}, {"a"}).nccl);
    }
};

QTEST_GUILESS_MAIN(TestRankShares)
#include "tst_rank_shares.moc"
