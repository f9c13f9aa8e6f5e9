#include <QtTest>

#include <atomic>
#include <map>
#include <string>
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

    // The GUI thread posts while the run thread takes at each batch boundary: every command is
    // taken once and whole (a target with its own rule, a device with its own rank), a later one
    // is never followed by an earlier one, and the last posted is the last taken. Under
    // ThreadSanitizer (scripts/check --sanitize thread) a post without the lock is a reported race.
    void commandsPostedWhileTheRunTakesThemArriveInOrder() {
        constexpr int kPosts = 5000;
        CommandMailbox box(false);
        std::atomic<bool> posted{false};
        std::thread gui([&] {
            for (int i = 1; i <= kPosts; ++i) {
                box.setTarget(i, i % 2 == 0 ? LrScaling::Linear : LrScaling::Sqrt);
                box.switchDevice("virtual:" + std::to_string(i) + "MiB", i % 3);
                if (i % 7 == 0) box.reprobe();
            }
            posted = true;
        });
        int64_t lastTarget = 0;
        std::map<int, int> lastDevice;  // rank -> MiB
        int reprobes = 0;
        bool ordered = true;
        bool whole = true;
        for (bool done = false; !done;) {
            done = posted.load();  // one more take after the last post
            const CommandMailbox::Batch taken = box.take();
            if (taken.target) {
                const int64_t t = taken.target->first;
                ordered = ordered && t > lastTarget;
                whole = whole && taken.target->second == (t % 2 == 0 ? LrScaling::Linear : LrScaling::Sqrt);
                lastTarget = t;
            }
            for (const auto& [rank, device] : taken.devices) {
                const int mib = std::stoi(device.substr(8));
                whole = whole && mib % 3 == rank;
                ordered = ordered && mib > lastDevice[rank];
                lastDevice[rank] = mib;
            }
            if (taken.reprobe) ++reprobes;
        }
        gui.join();
        QVERIFY2(ordered, "a command posted earlier was taken after a later one");
        QVERIFY2(whole, "a command was taken with another command's parts");
        QCOMPARE(lastTarget, int64_t{kPosts});
        QCOMPARE(lastDevice[kPosts % 3], kPosts);
        QVERIFY(reprobes >= 1 && reprobes <= kPosts / 7);
        const CommandMailbox::Batch after = box.take();
        QVERIFY(!after.target && after.devices.empty() && !after.reprobe);
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
