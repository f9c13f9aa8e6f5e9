// Following an events file as it grows (core/events/event_file.h): what a window watching a run
// gets from the file while the run writes it, a line at a time or cut anywhere, and from a file
// that is damaged, replaced or holds a line larger than any event.

#include <QtTest>
#include "tests/test_main.h"

#include <fstream>
#include <string>
#include <vector>

#include <QTemporaryDir>

#include "core/events/event_file.h"
#include "core/events/event_json.h"
#include "tests/core/events/sample_events.h"

namespace tst_event_file {

using namespace batchpilot::core;

namespace {

void append(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << text;
}

/// The events file the writer makes of `events`.
std::string fileOf(const std::vector<Event>& events) {
    std::string text;
    for (const Event& event : events) text += toJsonLine(event) + '\n';
    return text;
}

/// Everything the follower reads until the end of what the file holds now.
std::vector<Event> readToEnd(EventFileFollower& follower, std::vector<std::string>* skipped = nullptr,
                             size_t maxBytes = size_t{4} << 20) {
    std::vector<Event> events;
    for (int reads = 0; reads < 100000; ++reads) {
        auto batch = follower.read(maxBytes);
        if (!batch) {
            qWarning("%s", batch.error().c_str());
            return events;
        }
        for (Event& event : batch->events) events.push_back(std::move(event));
        if (skipped) skipped->insert(skipped->end(), batch->skipped.begin(), batch->skipped.end());
        if (batch->atEnd) return events;
    }
    qWarning("the follower never reached the end");
    return events;
}

std::vector<std::string> linesOf(const std::vector<Event>& events) {
    std::vector<std::string> lines;
    for (const Event& event : events) lines.push_back(toJsonLine(event));
    return lines;
}

}  // namespace

class TestEventFile : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void readsAFileCutAnywhere() {
        // The writer's file, appended in pieces cut at every kind of place (inside a line, right
        // after a newline, inside a multi-byte character): the same events, in order, each once.
        QTemporaryDir dir;
        const std::string path = dir.filePath(QStringLiteral("events.jsonl")).toStdString();
        const std::vector<Event> events = batchpilot::test::sampleEvents();
        const std::string text = fileOf(events);
        append(path, "");
        EventFileFollower follower(path);
        std::vector<Event> read;
        for (size_t cut = 0, piece = 1; cut < text.size(); cut += piece, piece = piece * 3 % 257 + 1) {
            append(path, text.substr(cut, piece));
            for (Event& event : readToEnd(follower, nullptr, 64)) read.push_back(std::move(event));
            // Nothing is delivered before its newline: what was read is always whole lines.
            QCOMPARE(follower.bytesRead() + follower.pendingBytes(),
                     static_cast<int64_t>(std::min(text.size(), cut + piece)));
        }
        QCOMPARE(linesOf(read), linesOf(events));
        QCOMPARE(follower.lines(), static_cast<int64_t>(events.size()));
        QCOMPARE(follower.skippedLines(), int64_t{0});
        QCOMPARE(follower.pendingBytes(), int64_t{0});
        QCOMPARE(follower.bytesRead(), static_cast<int64_t>(text.size()));
    }

    void bigReadsStopAtALine() {
        // A read asks for about maxBytes, and delivers whole lines: every event once over many reads.
        QTemporaryDir dir;
        const std::string path = dir.filePath(QStringLiteral("events.jsonl")).toStdString();
        std::vector<Event> events;
        for (int i = 0; i < 3000; ++i) events.push_back(StepMetrics{i * 0.5, i + 1, 0, (i + 1) * 64, 2.0 - i * 1e-4});
        append(path, fileOf(events));
        EventFileFollower follower(path);
        int reads = 0;
        std::vector<Event> read;
        for (;;) {
            auto batch = follower.read(4096);
            QVERIFY(batch.has_value());
            ++reads;
            for (Event& event : batch->events) read.push_back(std::move(event));
            if (batch->atEnd) break;
        }
        QCOMPARE(linesOf(read), linesOf(events));
        QVERIFY2(reads > 10, qPrintable(QString::number(reads)));
    }

    void damagedLinesAreSkippedAndNamed() {
        // A killed run's cut line, damage, a type from a newer version, a blank line and Windows
        // line ends: the events around them are read, each skip says its line and why.
        QTemporaryDir dir;
        const std::string path = dir.filePath(QStringLiteral("events.jsonl")).toStdString();
        const Warning first{1, "first"};
        const Warning last{2, "last"};
        append(path, toJsonLine(first) + "\r\n" + "{\"type\":\"step\",\"loss\":2.\n" + "\n" +
                         R"({"type":"hologram","time":3})" + "\n" + "\x01\x02 binary\n" + toJsonLine(last) + "\n" +
                         R"({"type":"step","loss")");
        EventFileFollower follower(path);
        std::vector<std::string> skipped;
        const std::vector<Event> read = readToEnd(follower, &skipped);
        QCOMPARE(linesOf(read), linesOf({first, last}));
        QCOMPARE(follower.skippedLines(), int64_t{3});
        QCOMPARE(skipped.size(), size_t{3});
        QVERIFY2(skipped[0].rfind("line 2: not JSON", 0) == 0, skipped[0].c_str());
        QVERIFY2(skipped[1].rfind("line 4: an event of unknown type \"hologram\"", 0) == 0, skipped[1].c_str());
        QVERIFY2(skipped[2].rfind("line 5: not JSON", 0) == 0, skipped[2].c_str());
        // The cut last line waits for the rest of it, which completes it.
        QCOMPARE(follower.pendingBytes(), int64_t{21});
        append(path, R"(:2.5,"step":9})"
                     "\n");
        const std::vector<Event> rest = readToEnd(follower);
        QCOMPARE(rest.size(), size_t{1});
        QCOMPARE(std::get<StepMetrics>(rest[0]).loss, 2.5);
        QCOMPARE(std::get<StepMetrics>(rest[0]).step, int64_t{9});
    }

    void aLineLargerThanAnyEventIsNotHeld() {
        // 17 MiB without a newline (a damaged file claiming a huge line): counted, not kept, and
        // skipped when it ends; the next event reads.
        QTemporaryDir dir;
        const std::string path = dir.filePath(QStringLiteral("events.jsonl")).toStdString();
        const size_t size = kMaxEventLineBytes + (size_t{1} << 20);
        append(path, "{\"type\":\"warning\",\"message\":\"" + std::string(size, 'x'));
        EventFileFollower follower(path);
        QVERIFY(readToEnd(follower).empty());
        QCOMPARE(follower.pendingBytes(), static_cast<int64_t>(size + 29));
        const Warning after{5, "after"};
        append(path, "\"}\n" + toJsonLine(after) + "\n");
        std::vector<std::string> skipped;
        const std::vector<Event> read = readToEnd(follower, &skipped);
        QCOMPARE(linesOf(read), linesOf({after}));
        QCOMPARE(skipped.size(), size_t{1});
        QVERIFY2(skipped[0].find("line 1: longer than 16 MiB") == 0, skipped[0].c_str());
    }

    void aFileReplacedOrMissingIsAnError() {
        QTemporaryDir dir;
        const std::string path = dir.filePath(QStringLiteral("events.jsonl")).toStdString();
        EventFileFollower missing(path);
        const auto none = missing.read();
        QVERIFY(!none.has_value());
        QVERIFY2(none.error().find("cannot be read") != std::string::npos, none.error().c_str());
        append(path, fileOf(batchpilot::test::sampleEvents()));
        EventFileFollower follower(path);
        QVERIFY(!readToEnd(follower).empty());
        // A new run writing the same path from its start: shorter than what was read.
        std::ofstream(path, std::ios::trunc) << toJsonLine(Warning{0, "new"}) << '\n';
        const auto replaced = follower.read();
        QVERIFY(!replaced.has_value());
        QVERIFY2(replaced.error().find("replaced or cut") != std::string::npos, replaced.error().c_str());
        // A folder where the file should be.
        EventFileFollower folder(dir.path().toStdString());
        const auto notFile = folder.read();
        QVERIFY(!notFile.has_value());
        QVERIFY2(notFile.error().find("not a file") != std::string::npos, notFile.error().c_str());
    }
};

}  // namespace tst_event_file

BATCHPILOT_TEST_MAIN(tst_event_file::TestEventFile)
#include "tst_event_file.moc"
