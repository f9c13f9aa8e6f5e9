// What a rank of a data-parallel job tells rank 0 of its probes and OOMs (core/events/event_json.h):
// every field comes back as it was sent, times move to the reader's clock by their age, other
// events stay out, and a malformed report is an error that names the event, never a crash.

#include <QtTest>
#include "tests/test_main.h"

#include "core/events/event_json.h"

namespace tst_rank_report {

using namespace batchpilot::core;

namespace {

ProbeStarted started() {
    return ProbeStarted{10.0, 2, ProbeReason::TargetBatchChange, "virtual:48MiB", 154, 47185920, 196608};
}
ProbeTrial trial(int number, int64_t microBatch, bool fit, double time) {
    return ProbeTrial{
        time, 2, number, microBatch, fit, fit && microBatch < 64, 1000000 + microBatch * 4096, fit ? 0 : 524288, 0.125};
}
ProbeFinished finished() {
    return ProbeFinished{12.5, 2, 48, 4, 192, 3, 2.5, false, 1.5e6, 40960.0};
}
OomEvent oom() {
    return OomEvent{13.0, 7, Phase::Backward, 48, 2097152, "injected failure \"quoted\"\nsecond line", true, 24, 0, {}};
}

}  // namespace

class TestRankReport : public QObject {
    Q_OBJECT

private Q_SLOTS:
    void everyFieldComesBack() {
        // Sent at 20.0 on the rank's clock, read at 100.0 on rank 0's: every time moves by 80.
        const std::vector<Event> sent{started(), trial(1, 64, false, 11.0), trial(2, 48, true, 12.0), finished(),
                                      oom()};
        const std::string text = rankReportText(sent, 20.0);
        const auto report = readRankReport(text, 100.0);
        QVERIFY2(report.has_value(), report ? "" : report.error().c_str());

        QCOMPARE(report->probes.size(), size_t{1});
        const ProbeStarted& p = report->probes[0];
        QCOMPARE(p.time, 90.0);
        QCOMPARE(p.sequence, 2);
        QCOMPARE(p.reason, ProbeReason::TargetBatchChange);
        QCOMPARE(p.device, std::string("virtual:48MiB"));
        QCOMPARE(p.upperBound, int64_t{154});
        QCOMPARE(p.usableBytes, int64_t{47185920});
        QCOMPARE(p.reservedBytes, int64_t{196608});

        QCOMPARE(report->trials.size(), size_t{2});
        const ProbeTrial& oomTrial = report->trials[0];
        QCOMPARE(oomTrial.time, 91.0);
        QCOMPARE(oomTrial.trial, 1);
        QCOMPARE(oomTrial.microBatch, int64_t{64});
        QVERIFY(!oomTrial.fit);
        QCOMPARE(oomTrial.failedAllocationBytes, int64_t{524288});
        const ProbeTrial& fitTrial = report->trials[1];
        QCOMPARE(fitTrial.time, 92.0);
        QCOMPARE(fitTrial.sequence, 2);
        QCOMPARE(fitTrial.trial, 2);
        QVERIFY(fitTrial.fit);
        QVERIFY(fitTrial.withinHeadroom);
        QCOMPARE(fitTrial.peakBytes, int64_t{1000000 + 48 * 4096});
        QCOMPARE(fitTrial.seconds, 0.125);

        QCOMPARE(report->finished.size(), size_t{1});
        const ProbeFinished& f = report->finished[0];
        QCOMPARE(f.time, 92.5);
        QCOMPARE(f.microBatch, int64_t{48});
        QCOMPARE(f.accumulationSteps, int64_t{4});
        QCOMPARE(f.targetBatch, int64_t{192});
        QCOMPARE(f.trials, 3);
        QCOMPARE(f.seconds, 2.5);
        QVERIFY(!f.hitTrialLimit);
        QCOMPARE(f.fixedBytes, 1.5e6);
        QCOMPARE(f.bytesPerSample, 40960.0);

        QCOMPARE(report->ooms.size(), size_t{1});
        const OomEvent& o = report->ooms[0];
        QCOMPARE(o.time, 93.0);
        QCOMPARE(o.step, int64_t{7});
        QCOMPARE(o.phase, Phase::Backward);
        QCOMPARE(o.microBatch, int64_t{48});
        QCOMPARE(o.requestedBytes, int64_t{2097152});
        QCOMPARE(o.message, std::string("injected failure \"quoted\"\nsecond line"));
        QVERIFY(o.recovered);
        QCOMPARE(o.newMicroBatch, int64_t{24});
    }

    void everyPhaseAndReasonIsReadBack() {
        // The names are toString's; each must map back to its own value.
        for (const Phase phase :
             {Phase::Copy, Phase::Forward, Phase::Backward, Phase::OptimizerStep, Phase::Setup, Phase::Validation}) {
            OomEvent event = oom();
            event.phase = phase;
            const auto report = readRankReport(rankReportText({event}, 20.0), 20.0);
            QVERIFY(report.has_value());
            QCOMPARE(report->ooms.at(0).phase, phase);
        }
        for (const ProbeReason reason :
             {ProbeReason::Initial, ProbeReason::UserRequest, ProbeReason::DeviceSwitch, ProbeReason::TargetBatchChange,
              ProbeReason::Regrow, ProbeReason::MemorySavers}) {
            ProbeStarted event = started();
            event.reason = reason;
            const auto report = readRankReport(rankReportText({event}, 20.0), 20.0);
            QVERIFY(report.has_value());
            QCOMPARE(report->probes.at(0).reason, reason);
        }
    }

    void otherEventsStayOut() {
        // A step, a warning and a memory sample are the rank's own business: nothing to send.
        const std::vector<Event> events{StepMetrics{}, Warning{1.0, "slow"}, MemorySample{}};
        QCOMPARE(rankReportText(events, 5.0), std::string());
        const auto empty = readRankReport(std::string(), 5.0);
        QVERIFY(empty.has_value());
        QVERIFY(empty->trials.empty() && empty->probes.empty() && empty->finished.empty() && empty->ooms.empty());
    }

    void malformedReportsAreErrors_data() {
        QTest::addColumn<QString>("text");
        QTest::addColumn<QString>("named");
        QTest::newRow("not JSON") << QStringLiteral("[{\"type\":") << QStringLiteral("not a JSON array");
        QTest::newRow("an object") << QStringLiteral("{\"type\":\"oom\"}") << QStringLiteral("not a JSON array");
        QTest::newRow("missing field")
            << QStringLiteral(R"([{"type":"probe_trial","age":1,"sequence":1,"trial":1,"micro_batch":8}])")
            << QStringLiteral("event 1");
        QTest::newRow("wrong type") << QStringLiteral(R"([{"type":"probe_finished","age":"soon","sequence":1}])")
                                    << QStringLiteral("event 1");
        QTest::newRow("unknown phase")
            << QStringLiteral(
                   R"([{"type":"oom","age":0,"step":1,"phase":"sideways","micro_batch":1,"requested_bytes":0,)"
                   R"("message":"","recovered":true,"new_micro_batch":1}])")
            << QStringLiteral("unknown phase \"sideways\"");
        QTest::newRow("other event") << QStringLiteral(R"([{"type":"step","age":0}])")
                                     << QStringLiteral("an event of type \"step\"");
        QTest::newRow("not an object") << QStringLiteral("[3]") << QStringLiteral("event 1");
    }

    void malformedReportsAreErrors() {
        QFETCH(QString, text);
        QFETCH(QString, named);
        const auto report = readRankReport(text.toStdString(), 1.0);
        QVERIFY(!report.has_value());
        QVERIFY2(QString::fromStdString(report.error()).contains(named), report.error().c_str());
    }
};

}  // namespace tst_rank_report

BATCHPILOT_TEST_MAIN(tst_rank_report::TestRankReport)
#include "tst_rank_report.moc"
