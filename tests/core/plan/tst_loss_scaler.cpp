// float16 autocast's loss scale (core/plan/loss_scaler.h) against the rule of PyTorch's
// GradScaler, written out by hand: torch/amp/grad_scaler.py's defaults (backoff 0.5, growth 2,
// growth interval 2000) and `_amp_update_scale_` (an overflow multiplies the scale by the backoff
// and zeroes the growth tracker; otherwise the tracker counts up, and on reaching the interval the
// scale is multiplied by the growth factor and the tracker zeroed). BatchPilot adds its bounds: an
// overflow at scale 1 ends the run, and the scale stops growing at kMaxLossScale.

#include <QtTest>
#include "tests/test_main.h"

#include <string>
#include <vector>

#include "core/plan/loss_scaler.h"

namespace tst_loss_scaler {

using namespace batchpilot::core;

class TestLossScaler : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void followsGradScalersRule_data() {
        QTest::addColumn<double>("initial");
        QTest::addColumn<qint64>("interval");
        // One letter a step: c a clean step, o an overflow (the batch trained again), x an overflow
        // that ends the run.
        QTest::addColumn<QString>("steps");
        QTest::addColumn<std::vector<double>>("scales");  ///< the scale after each letter
        QTest::newRow("three clean steps of an interval of 3 double it")
            << 1024.0 << qint64{3} << QStringLiteral("ccc") << std::vector<double>{1024, 1024, 2048};
        QTest::newRow("an overflow halves it and the count starts again")
            << 1024.0 << qint64{3} << QStringLiteral("ccoccc") << std::vector<double>{1024, 1024, 512, 512, 512, 1024};
        QTest::newRow("overflows in a row halve it each time")
            << 65536.0 << qint64{2000} << QStringLiteral("ooo") << std::vector<double>{32768, 16384, 8192};
        QTest::newRow("growth again after growth")
            << 1.0 << qint64{2} << QStringLiteral("cccccc") << std::vector<double>{1, 2, 2, 4, 4, 8};
        QTest::newRow("at 1 an overflow ends the run")
            << 2.0 << qint64{2000} << QStringLiteral("ox") << std::vector<double>{1, 1};
        QTest::newRow("GradScaler's own interval: 1,999 clean steps are not enough")
            << 65536.0 << qint64{2000} << QString(1999, QLatin1Char('c')) + QStringLiteral("c") << [] {
                   std::vector<double> scales(1999, 65536.0);
                   scales.push_back(131072.0);
                   return scales;
               }();
        QTest::newRow("it stops growing at the most")
            << kMaxLossScale / 2 << qint64{1} << QStringLiteral("ccc")
            << std::vector<double>{kMaxLossScale, kMaxLossScale, kMaxLossScale};
    }
    void followsGradScalersRule() {
        QFETCH(double, initial);
        QFETCH(qint64, interval);
        QFETCH(QString, steps);
        QFETCH(std::vector<double>, scales);
        QCOMPARE(static_cast<size_t>(steps.size()), scales.size());
        LossScaler scaler(initial, interval);
        for (qsizetype i = 0; i < steps.size(); ++i) {
            const double before = scaler.scale();
            const char step = steps[i].toLatin1();
            const auto change = step == 'c' ? scaler.stepped() : scaler.overflowed();
            QVERIFY2(change.has_value() == (step == 'o' || (step == 'c' && scales[i] != before)),
                     qPrintable(QStringLiteral("step %1 (%2)").arg(i).arg(QLatin1Char(step))));
            if (change) {
                QCOMPARE(change->from, before);
                QCOMPARE(change->to, scales[i]);
            }
            QCOMPARE(scaler.scale(), scales[i]);
        }
    }

    void aResumeGoesOnAtTheRecordedScale() {
        LossScaler scaler(65536, 3);
        scaler.stepped();
        scaler.resume(512);
        QCOMPARE(scaler.scale(), 512.0);
        scaler.resume(0);  // a checkpoint that recorded none
        QCOMPARE(scaler.scale(), 512.0);
    }
};

}  // namespace tst_loss_scaler

BATCHPILOT_TEST_MAIN(tst_loss_scaler::TestLossScaler)
#include "tst_loss_scaler.moc"
