#include <cmath>
#include <limits>

#include <QtTest>
#include "tests/test_main.h"

#include "ui/charts/ema.h"
#include "ui/charts/series_store.h"
#include "ui/charts/thinning.h"

namespace tst_chart_store {

using batchpilot::ui::DebiasedEma;
using batchpilot::ui::SeriesStore;
using batchpilot::ui::thinMinMax;

class TestChartStore : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void keepsEverythingBelowCapacity();
    void millionPointsStayBounded();
    void decimationKeepsSpikes_data();
    void decimationKeepsSpikes();
    void staysSortedByX();
    void thinningKeepsMinAndMaxPerColumn();
    void thinningLeavesSmallInputAlone();
    void thinningKeepsNeighboursOutsideRange();
    void emaIsDebiased();
    void emaZeroSmoothingIsRaw();
    void emaWeighsBySpacing();
};

void TestChartStore::keepsEverythingBelowCapacity() {
    SeriesStore store(1000);
    for (int i = 0; i < 999; ++i) store.append(i, i * 2.0);
    QCOMPARE(store.size(), std::size_t(999));
    QVERIFY(store.isFullResolution());
    QCOMPARE(store.points()[500], QPointF(500, 1000));
}

void TestChartStore::millionPointsStayBounded() {
    const std::size_t capacity = 50000;
    SeriesStore store(capacity);
    for (int i = 0; i < 1'000'000; ++i) store.append(i, std::sin(i * 0.001));
    QCOMPARE(store.rawCount(), std::size_t(1'000'000));
    QVERIFY2(store.size() <= capacity + 2, qPrintable(QString::number(store.size())));
    QVERIFY(store.size() >= capacity / 4);  // not thrown away either
    QVERIFY(!store.isFullResolution());
    QCOMPARE(store.minX(), 0.0);
    QCOMPARE(store.maxX(), 999'999.0);
    QCOMPARE(store.last(), QPointF(999'999, std::sin(999'999 * 0.001)));
    // The whole x range is still covered.
    QCOMPARE(store.points().front().x(), 0.0);
    QVERIFY(store.points().back().x() > 999'000);
}

void TestChartStore::decimationKeepsSpikes_data() {
    QTest::addColumn<int>("at");
    QTest::addColumn<double>("value");
    QTest::newRow("early spike up") << 1234 << 1000.0;
    QTest::newRow("early spike down") << 4321 << -1000.0;
    QTest::newRow("middle spike") << 500'001 << 77.0;
    QTest::newRow("late spike") << 999'990 << -55.0;
}

void TestChartStore::decimationKeepsSpikes() {
    QFETCH(int, at);
    QFETCH(double, value);
    SeriesStore store(10000);
    for (int i = 0; i < 1'000'000; ++i) store.append(i, i == at ? value : std::cos(i * 0.01));
    bool found = false;
    for (const QPointF& p : store.points()) found = found || (p.x() == at && p.y() == value);
    QVERIFY2(found, "the extreme value was decimated away");
    QCOMPARE(value > 0 ? store.maxY() : store.minY(), value);
}

void TestChartStore::staysSortedByX() {
    SeriesStore store(512);
    for (int i = 0; i < 100'000; ++i) store.append(i * 0.5, (i * 7919) % 101);
    const auto& points = store.points();
    for (std::size_t i = 1; i < points.size(); ++i) QVERIFY(points[i - 1].x() <= points[i].x());
}

void TestChartStore::thinningKeepsMinAndMaxPerColumn() {
    std::vector<QPointF> points;
    for (int i = 0; i < 100'000; ++i) points.emplace_back(i, std::sin(i * 0.05));
    points[31'337].setY(50);  // spikes must survive
    points[77'777].setY(-50);
    const int columns = 500;
    const auto thinned = thinMinMax(points, 0, 99'999, columns);
    QVERIFY2(thinned.size() <= std::size_t(columns) * 2 + 4, qPrintable(QString::number(thinned.size())));
    QVERIFY(thinned.size() >= std::size_t(columns));
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const QPointF& p : thinned) {
        lo = std::min(lo, p.y());
        hi = std::max(hi, p.y());
    }
    QCOMPARE(hi, 50.0);
    QCOMPARE(lo, -50.0);
    for (std::size_t i = 1; i < thinned.size(); ++i) QVERIFY(thinned[i - 1].x() <= thinned[i].x());
}

void TestChartStore::thinningLeavesSmallInputAlone() {
    std::vector<QPointF> points = {{0, 1}, {1, 3}, {2, 2}};
    const auto thinned = thinMinMax(points, 0, 2, 800);
    QCOMPARE(thinned.size(), points.size());
    QVERIFY(thinMinMax({}, 0, 1, 100).empty());
}

void TestChartStore::thinningKeepsNeighboursOutsideRange() {
    std::vector<QPointF> points;
    for (int i = 0; i < 100; ++i) points.emplace_back(i, i);
    const auto thinned = thinMinMax(points, 10.5, 20.5, 200);
    QCOMPARE(thinned.front().x(), 10.0);  // so the line reaches the left edge
    QCOMPARE(thinned.back().x(), 21.0);
}

void TestChartStore::emaIsDebiased() {
    // A constant signal stays constant from the first value on: no pull toward zero.
    DebiasedEma ema(0.99);
    for (int i = 0; i < 10; ++i) QCOMPARE(ema.add(2.5), 2.5);
    // And it follows a step change only gradually.
    const double after = ema.add(0.0);
    QVERIFY(after > 2.0 && after < 2.5);
    const auto smoothed = DebiasedEma::smooth(std::vector<QPointF>{{0, 4}, {1, 4}}, 0.9);
    QCOMPARE(smoothed[0].y(), 4.0);
    QCOMPARE(smoothed[1].y(), 4.0);
}

void TestChartStore::emaWeighsBySpacing() {
    // Evenly spaced points smooth as the point-by-point EMA does, at any scale of x (steps,
    // samples seen, seconds).
    const std::vector<double> values = {3, 1, 4, 1, 5, 9, 2, 6};
    DebiasedEma byPoint(0.8), bySteps(0.8), bySamples(0.8);
    for (size_t i = 0; i < values.size(); ++i) {
        const double expected = byPoint.add(values[i]);
        QVERIFY(std::abs(bySteps.add(static_cast<double>(i + 1), values[i]) - expected) < 1e-12);
        QVERIFY(std::abs(bySamples.add(4096.0 * static_cast<double>(i), values[i]) - expected) < 1e-12);
    }
    // A constant signal stays constant whatever the spacing.
    DebiasedEma constant(0.9);
    for (const double x : {0.0, 0.1, 0.2, 5.0, 5.1, 60.0}) QCOMPARE(constant.add(x, 7.0), 7.0);
    // After a long pause the new value counts for the time that passed: it pulls the average
    // further than the same value one step later does.
    DebiasedEma soon(0.9), late(0.9);
    for (int i = 0; i < 20; ++i) {
        soon.add(i, 1.0);
        late.add(i, 1.0);
    }
    const double oneStepLater = soon.add(20, 0.0);
    const double longAfter = late.add(60, 0.0);
    QVERIFY2(longAfter < oneStepLater && oneStepLater < 1.0,
             qPrintable(QStringLiteral("%1 after a pause, %2 one step later").arg(longAfter).arg(oneStepLater)));
    // Smoothing 0 is the raw line, also with uneven spacing.
    DebiasedEma raw(0.0);
    QCOMPARE(raw.add(0, 1.0), 1.0);
    QCOMPARE(raw.add(7, 5.0), 5.0);
}

void TestChartStore::emaZeroSmoothingIsRaw() {
    const std::vector<QPointF> raw = {{0, 1}, {1, 5}, {2, -3}};
    const auto smoothed = DebiasedEma::smooth(raw, 0.0);
    for (std::size_t i = 0; i < raw.size(); ++i) QCOMPARE(smoothed[i], raw[i]);
}

}  // namespace tst_chart_store

BATCHPILOT_TEST_MAIN(tst_chart_store::TestChartStore)
#include "tst_chart_store.moc"
