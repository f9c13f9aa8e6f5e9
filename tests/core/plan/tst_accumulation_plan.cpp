#include <QtTest>
#include "tests/test_main.h"

#include <numeric>

#include "core/plan/accumulation_plan.h"

namespace tst_accumulation_plan {

using batchpilot::core::AccumulationPlan;

class TestAccumulationPlan : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void splitsEvenly_data() {
        QTest::addColumn<qint64>("target");
        QTest::addColumn<qint64>("micro");
        QTest::addColumn<QList<qint64>>("sizes");
        QTest::newRow("100 at 32") << qint64(100) << qint64(32) << QList<qint64>{25, 25, 25, 25};
        QTest::newRow("4096 at 128") << qint64(4096) << qint64(128) << QList<qint64>(32, 128);
        QTest::newRow("10 at 3") << qint64(10) << qint64(3) << QList<qint64>{3, 3, 2, 2};
        QTest::newRow("micro above target") << qint64(8) << qint64(50) << QList<qint64>{8};
        QTest::newRow("micro 1") << qint64(3) << qint64(1) << QList<qint64>{1, 1, 1};
        QTest::newRow("64 at 7") << qint64(64) << qint64(7) << QList<qint64>{7, 7, 7, 7, 6, 6, 6, 6, 6, 6};
    }
    void splitsEvenly() {
        QFETCH(qint64, target);
        QFETCH(qint64, micro);
        QFETCH(QList<qint64>, sizes);
        const AccumulationPlan plan(target, micro);
        QCOMPARE(plan.steps(), qint64(sizes.size()));
        QList<qint64> got(plan.sizes().begin(), plan.sizes().end());
        QCOMPARE(got, sizes);
        QCOMPARE(std::accumulate(plan.sizes().begin(), plan.sizes().end(), int64_t{0}), target);
        const auto [smallest, largest] = std::minmax_element(plan.sizes().begin(), plan.sizes().end());
        QVERIFY(*largest - *smallest <= 1);
        QVERIFY(*largest <= micro);
        // The rule without the list (what views of a plan use) describes the same sizes.
        const auto even = batchpilot::core::EvenSplit::of(target, micro);
        QCOMPARE(even.parts, qint64(sizes.size()));
        qint64 offset = 0;
        for (qsizetype i = 0; i < sizes.size(); ++i) {
            QCOMPARE(even.sizeOf(i), sizes[i]);
            QCOMPARE(even.offsetOf(i), offset);
            offset += sizes[i];
        }
        QCOMPARE(even.offsetOf(even.parts), target);
        // Its sum, as printed for a person, names the same sizes in runs of equal ones.
        QString runs;
        for (qsizetype i = 0; i < sizes.size();) {
            qsizetype j = i;
            while (j < sizes.size() && sizes[j] == sizes[i]) ++j;
            runs += QStringLiteral("%1%2 × %3")
                        .arg(runs.isEmpty() ? QString() : QStringLiteral(" + "))
                        .arg(j - i)
                        .arg(sizes[i]);
            i = j;
        }
        QCOMPARE(QString::fromStdString(even.sum()), runs);
    }

    /// A view of a 2^31-sample batch in micro-batches of 1 must not build a list of 2^31 sizes.
    void evenSplitOfHugeBatches() {
        const qint64 target = qint64(1) << 31;
        const auto even = batchpilot::core::EvenSplit::of(target, 3);
        QCOMPARE(even.parts, (target + 2) / 3);
        QCOMPARE(even.offsetOf(even.parts), target);
        QCOMPARE(even.sizeOf(0) - even.sizeOf(even.parts - 1), qint64(even.larger > 0 ? 1 : 0));
        const auto none = batchpilot::core::EvenSplit::of(0, 4);
        QCOMPARE(none.parts, qint64(0));
    }

    void weightsSumToOne() {
        const AccumulationPlan plan(100, 32);
        double total = 0;
        for (int64_t i = 0; i < plan.steps(); ++i) {
            QCOMPARE(plan.weight(i), double(plan.sizes()[size_t(i)]) / 100.0);
            total += plan.weight(i);
        }
        QCOMPARE(total, 1.0);
        QCOMPARE(plan.offset(0), qint64(0));
        QCOMPARE(plan.offset(3), qint64(75));
    }

    void rejectsNonPositiveSizes() {
        QVERIFY_THROWS_EXCEPTION(std::invalid_argument, AccumulationPlan(0, 4));
        QVERIFY_THROWS_EXCEPTION(std::invalid_argument, AccumulationPlan(16, 0));
    }
};

}  // namespace tst_accumulation_plan

BATCHPILOT_TEST_MAIN(tst_accumulation_plan::TestAccumulationPlan)
#include "tst_accumulation_plan.moc"
