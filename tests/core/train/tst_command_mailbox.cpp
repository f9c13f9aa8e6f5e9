#include <QtTest>

#include <atomic>
#include <thread>

#include "core/train/command_mailbox.h"

using namespace batchpilot::core;

/// The trainer's commands as a user posts them from the GUI thread while the run thread waits:
/// nothing is lost, nothing applies twice, and a stop always ends a wait.
class TestCommandMailbox : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void batchCommandsAreTakenOnce() {
        CommandMailbox box(false);
        box.setTarget(128, LrScaling::Linear);
        box.setTarget(256, LrScaling::Sqrt);  // the later one wins
        box.switchDevice("virtual:32MiB", 0);
        box.switchDevice("virtual:64MiB", 0);  // the later one for the same rank wins
        box.switchDevice("virtual:96MiB", 2);  // several devices: each rank its own
        box.reprobe();
        box.checkEquivalence(-3);  // below 0: the whole batch
        auto taken = box.take();
        QVERIFY(taken.target.has_value());
        QCOMPARE(taken.target->first, int64_t{256});
        QCOMPARE(taken.target->second, LrScaling::Sqrt);
        const std::map<int, std::string> devices{{0, "virtual:64MiB"}, {2, "virtual:96MiB"}};
        QVERIFY(taken.devices == devices);
        QVERIFY(taken.reprobe);
        QCOMPARE(taken.equivalence.value_or(-1), int64_t{0});
        const auto again = box.take();
        QVERIFY(!again.target && again.devices.empty() && !again.equivalence && !again.reprobe);
    }

    void stopEndsAPause() {
        CommandMailbox box(false);
        box.pause();
        std::atomic<int> paused{0};
        std::atomic<int> resumed{0};
        bool running = true;
        std::thread run([&] { running = box.waitWhilePaused([&] { ++paused; }, [&] { ++resumed; }); });
        QTRY_COMPARE(paused.load(), 1);
        QVERIFY(box.pauseRequested());
        box.stop();
        run.join();
        QVERIFY(!running);
        QVERIFY(!box.pauseRequested());    // a stopped run has no pause to vote for
        QCOMPARE(resumed.load(), 0);       // stopped, not resumed
        QVERIFY(box.cancelFlag().load());  // loaders see the stop too
    }

    void resumeEndsAPause() {
        CommandMailbox box(false);
        QVERIFY(!box.pauseRequested());
        box.pause();
        QVERIFY(box.pauseRequested());  // what several devices vote on at the next batch
        std::atomic<int> resumed{0};
        std::atomic<bool> waiting{false};
        bool running = false;
        std::thread run([&] { running = box.waitWhilePaused([&] { waiting = true; }, [&] { ++resumed; }); });
        QTRY_VERIFY(waiting.load());
        box.resume();
        run.join();
        QVERIFY(running);
        QCOMPARE(resumed.load(), 1);
        QVERIFY(!box.pauseRequested());
    }

    /// Step mode: each advance() lets exactly one micro-batch run; finishBatch() lets the rest of
    /// the batch run without waiting until batchDone().
    void stepModeCountsAdvances() {
        CommandMailbox box(true);
        box.advance();
        box.advance();
        int announced = 0;
        QVERIFY(box.waitForAdvance([&] { ++announced; }));
        QVERIFY(box.waitForAdvance([&] { ++announced; }));
        QCOMPARE(announced, 0);  // both were allowed before they were asked for
        std::atomic<bool> asked{false};
        bool allowed = false;
        std::thread run([&] { allowed = box.waitForAdvance([&] { asked = true; }); });
        QTRY_VERIFY(asked.load());
        box.finishBatch();
        run.join();
        QVERIFY(allowed);
        QVERIFY(box.waitForAdvance([&] { QFAIL("finishing the batch: no wait"); }));
        box.batchDone();
        std::atomic<bool> askedAgain{false};
        std::thread next([&] { allowed = box.waitForAdvance([&] { askedAgain = true; }); });
        QTRY_VERIFY(askedAgain.load());
        box.setStepMode(false);  // leaving step mode releases the wait
        next.join();
        QVERIFY(allowed);
        box.advance();  // ignored outside step mode: no token is left for later
        box.setStepMode(true);
        std::atomic<bool> askedLast{false};
        std::thread last([&] { allowed = box.waitForAdvance([&] { askedLast = true; }); });
        QTRY_VERIFY(askedLast.load());
        box.stop();
        last.join();
        QVERIFY(!allowed);
    }
};

QTEST_GUILESS_MAIN(TestCommandMailbox)
#include "tst_command_mailbox.moc"
