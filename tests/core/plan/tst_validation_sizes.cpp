// The micro-batch of validation passes (core/plan/validation_sizes.h), on a device of which the
// test keeps the books: a micro-batch of n samples needs `resident` + n × `perSample` bytes and
// runs out of memory beyond `usable`, while what it reports of itself may be less than it needs
// (`measured` bytes a sample, as a caching allocator's cache hides some of it). Each row's
// micro-batches were worked out by hand from the rule: begin at training's micro-batch, double
// while twice the measured activations fit and no size that large ran out, at most four times
// training's (at least 256) and the held-out count; halve on running out; the next pass begins
// where the last ended.

#include <QtTest>
#include "tests/test_main.h"

#include <string>
#include <vector>

#include "core/plan/validation_sizes.h"

namespace tst_validation_sizes {

using namespace batchpilot::core;

namespace {

/// "4 8 16! 8*3 | 8": each pass's micro-batches in order ("!" one that ran out of memory, "!!"
/// the run ended there), passes split by "|", "8*3" for three of 8.
QString expand(const QString& text) {
    QStringList out;
    for (const QString& word : text.split(QLatin1Char(' '), Qt::SkipEmptyParts)) {
        const qsizetype star = word.indexOf(QLatin1Char('*'));
        if (star < 0) {
            out << word;
            continue;
        }
        for (int i = 0; i < word.mid(star + 1).toInt(); ++i) out << word.left(star);
    }
    return out.join(QLatin1Char(' '));
}

}  // namespace

class TestValidationSizes : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void passesOnABookKeptDevice_data() {
        QTest::addColumn<qint64>("total");
        QTest::addColumn<qint64>("training");
        QTest::addColumn<qint64>("resident");
        QTest::addColumn<qint64>("perSample");
        QTest::addColumn<qint64>("measured");
        QTest::addColumn<qint64>("usable");
        QTest::addColumn<int>("passes");
        QTest::addColumn<QString>("expected");
        QTest::newRow("room to spare: doubles to the held-out count, the next pass begins there")
            << qint64{100} << qint64{4} << qint64{0} << qint64{1} << qint64{1} << qint64{1000} << 2
            << QStringLiteral("4 8 16 32 40 | 64 36");
        QTest::newRow("memory under-reported: runs out once, never tries that size again")
            << qint64{100} << qint64{4} << qint64{0} << qint64{3} << qint64{1} << qint64{40} << 2
            << QStringLiteral("4 8 16! 8*11 | 8*12 4");
        QTest::newRow("at most 256 where four times training's is less")
            << qint64{10000} << qint64{2} << qint64{0} << qint64{1} << qint64{1} << qint64{1'000'000'000} << 1
            << QStringLiteral("2 4 8 16 32 64 128 256*38 18");
        QTest::newRow("training's memory leaves no room for twice: stays at training's")
            << qint64{50} << qint64{10} << qint64{90} << qint64{1} << qint64{1} << qint64{100} << 1
            << QStringLiteral("10*5");
        QTest::newRow("not one sample fits: the run ends") << qint64{10} << qint64{1} << qint64{0} << qint64{3}
                                                           << qint64{3} << qint64{2} << 1 << QStringLiteral("1!!");
    }
    void passesOnABookKeptDevice() {
        QFETCH(qint64, total);
        QFETCH(qint64, training);
        QFETCH(qint64, resident);
        QFETCH(qint64, perSample);
        QFETCH(qint64, measured);
        QFETCH(qint64, usable);
        QFETCH(int, passes);
        QFETCH(QString, expected);
        ValidationSizes sizes;
        QStringList seen;
        for (int pass = 0; pass < passes; ++pass) {
            if (pass > 0) seen << QStringLiteral("|");
            sizes.begin(total, training);
            int64_t evaluated = 0;
            bool ended = false;
            while (evaluated < total && !ended) {
                const int64_t n = std::min<int64_t>(sizes.size(), total - evaluated);
                QVERIFY(n >= 1);
                if (resident + n * perSample > usable) {
                    ended = !sizes.outOfMemory(n);
                    seen << QString::number(n) + (ended ? QStringLiteral("!!") : QStringLiteral("!"));
                    continue;
                }
                seen << QString::number(n);
                evaluated += n;
                sizes.ran(n, resident, n * measured, usable);
            }
            if (ended) break;
            QCOMPARE(evaluated, total);  // every held-out sample once
            sizes.end();
        }
        QCOMPARE(seen.join(QLatin1Char(' ')), expand(expected));
    }
};

}  // namespace tst_validation_sizes

BATCHPILOT_TEST_MAIN(tst_validation_sizes::TestValidationSizes)
#include "tst_validation_sizes.moc"
