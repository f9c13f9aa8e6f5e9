// Reading a served run's event stream (core/events/event_stream.h), as the window connected to a
// run does: the text/event-stream records `batchpilot-cli --serve` sends, cut anywhere by the
// network, and what a server that is not BatchPilot's (or a broken one) may send instead.

#include <QtTest>
#include "tests/test_main.h"

#include <string>
#include <vector>

#include "core/events/event_json.h"
#include "core/events/event_stream.h"
#include "tests/core/events/sample_events.h"

namespace tst_event_stream {

using namespace batchpilot::core;

namespace {

/// The stream as the HTML standard's event-stream format has it, the way the server writes one
/// record per event (app/run_server.cpp): "id: N", "data: " and the event's line, an empty line.
std::string streamOf(const std::vector<Event>& events, int64_t firstId = 1) {
    std::string text;
    for (size_t i = 0; i < events.size(); ++i)
        text +=
            "id: " + std::to_string(firstId + static_cast<int64_t>(i)) + "\ndata: " + toJsonLine(events[i]) + "\n\n";
    return text;
}

struct Read {
    std::vector<std::string> lines;  ///< each event read, as its line, or "! " and the error
    std::vector<int64_t> ids;
};

/// Everything `reader` gives for `text` appended `piece` bytes at a time; the most it held is
/// checked against `mostHeld` after each piece's records are taken.
Read readIn(EventStreamReader& reader, const std::string& text, size_t piece, size_t mostHeld = SIZE_MAX) {
    Read read;
    for (size_t at = 0; at < text.size(); at += piece) {
        reader.append(std::string_view(text).substr(at, piece));
        while (auto record = reader.next()) {
            read.ids.push_back(record->id);
            read.lines.push_back(record->event ? toJsonLine(*record->event) : "! " + record->event.error());
        }
        if (reader.held() > mostHeld) return {};
    }
    return read;
}

}  // namespace

class TestEventStream : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void everyEventArrivesWhereverTheStreamIsCut() {
        const std::vector<Event> events = batchpilot::test::sampleEvents();
        const std::string text = streamOf(events);
        std::vector<std::string> expected;
        for (const Event& event : events) expected.push_back(toJsonLine(event));
        for (const size_t piece : {size_t{1}, size_t{2}, size_t{7}, size_t{100}, text.size()}) {
            EventStreamReader reader;
            const Read read = readIn(reader, text, piece);
            QCOMPARE(read.lines, expected);
            QCOMPARE(read.ids.front(), int64_t{1});
            QCOMPARE(reader.lastId(), static_cast<int64_t>(events.size()));
            QCOMPARE(reader.held(), size_t{0});
        }
    }

    void commentsAndRepeatsArePassedOver() {
        const std::vector<Event> events = batchpilot::test::sampleEvents();
        // A keep-alive comment, then events 1-3, then 2-5 again (a server that repeats), then an
        // event without an id.
        const std::string text = ": keep-alive\n\n" + streamOf({events[0], events[1], events[2]}) +
                                 streamOf({events[1], events[2], events[3], events[4]}, 2) +
                                 "data: " + toJsonLine(events[5]) + "\n\n";
        EventStreamReader reader;
        const Read read = readIn(reader, text, 5);
        QCOMPARE(read.lines,
                 (std::vector<std::string>{toJsonLine(events[0]), toJsonLine(events[1]), toJsonLine(events[2]),
                                           toJsonLine(events[3]), toJsonLine(events[4]), toJsonLine(events[5])}));
        QCOMPARE(read.ids, (std::vector<int64_t>{1, 2, 3, 4, 5, 0}));
        QCOMPARE(reader.lastId(), int64_t{5});
    }

    void whatIsNotAnEventIsSaidAndSkipped() {
        const std::vector<Event> events = batchpilot::test::sampleEvents();
        const std::string text = streamOf({events[0]}) + "id: 2\ndata: {\"type\":\"step\",\"step\":\n\n" +
                                 "id: x\ndata: not json\n\n" + streamOf({events[1]}, 3);
        EventStreamReader reader;
        const Read read = readIn(reader, text, 3);
        QCOMPARE(read.lines.size(), size_t{4});
        QCOMPARE(read.lines[0], toJsonLine(events[0]));
        QVERIFY2(read.lines[1].starts_with("! "), read.lines[1].c_str());
        QVERIFY2(read.lines[2].starts_with("! "), read.lines[2].c_str());
        QCOMPARE(read.lines[3], toJsonLine(events[1]));
        QCOMPARE(read.ids, (std::vector<int64_t>{1, 2, 0, 3}));
    }

    // A server that sends one endless record: dropped as it comes, never held whole; what follows
    // its end is read.
    void aRecordLongerThanAnyEventIsNeverHeld() {
        const std::vector<Event> events = batchpilot::test::sampleEvents();
        const size_t piece = size_t{1} << 20;
        const std::string endless = "id: 2\ndata: [" + std::string(size_t{48} << 20, '1') + "]\n\n";
        const std::string text = streamOf({events[0]}) + endless + streamOf({events[1]}, 3);
        EventStreamReader reader;
        const Read read = readIn(reader, text, piece, EventStreamReader::kMaxRecordBytes + 2 + piece);
        QCOMPARE(read.lines.size(), size_t{3});
        QCOMPARE(read.lines[0], toJsonLine(events[0]));
        QVERIFY2(read.lines[1].find("longer than") != std::string::npos, read.lines[1].c_str());
        QCOMPARE(read.lines[2], toJsonLine(events[1]));
        QCOMPARE(reader.lastId(), int64_t{3});
        // Whole at once, the same is read.
        EventStreamReader whole;
        QCOMPARE(readIn(whole, text, text.size()).lines, read.lines);
    }

    // The connection was cut in a record: the next one starts clean, and asks for what follows
    // the last id received.
    void aNewConnectionDropsTheCutRecord() {
        const std::vector<Event> events = batchpilot::test::sampleEvents();
        const std::string first = streamOf({events[0], events[1]});
        EventStreamReader reader;
        Read read = readIn(reader, first.substr(0, first.size() - 10), 4);
        QCOMPARE(read.lines.size(), size_t{1});
        QCOMPARE(reader.lastId(), int64_t{1});
        reader.restart();
        QCOMPARE(reader.held(), size_t{0});
        read = readIn(reader, streamOf({events[1], events[2]}, 2), 4);
        QCOMPARE(read.lines, (std::vector<std::string>{toJsonLine(events[1]), toJsonLine(events[2])}));
        QCOMPARE(reader.lastId(), int64_t{3});
    }
};

}  // namespace tst_event_stream

BATCHPILOT_TEST_MAIN(tst_event_stream::TestEventStream)
#include "tst_event_stream.moc"
