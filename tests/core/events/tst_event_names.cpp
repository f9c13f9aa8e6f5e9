// The events file's "type" names: one per event type, none shared, each the name the events file
// format documents (docs/reference/events.md), and every type written as one JSON line that says it.

#include <QtTest>
#include "tests/test_main.h"

#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/events/event_json.h"
#include "core/events/events.h"

namespace tst_event_names {

using namespace batchpilot::core;

namespace {

/// One default-constructed event of every type the variant holds.
template <size_t... I>
std::vector<Event> oneOfEach(std::index_sequence<I...>) {
    return {Event(std::in_place_index<I>)...};
}

}  // namespace

class TestEventNames : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void everyTypeHasItsOwnDocumentedName() {
        // The names readers of events.jsonl rely on, as the format documents them.
        const std::set<std::string> documented = {"state",
                                                  "probe_started",
                                                  "probe_trial",
                                                  "probe_finished",
                                                  "oom",
                                                  "memory",
                                                  "step",
                                                  "micro_batch",
                                                  "optimizer_step",
                                                  "target_batch",
                                                  "device_switch",
                                                  "warning",
                                                  "checkpoint",
                                                  "error",
                                                  "run_summary",
                                                  "memory_breakdown",
                                                  "step_mode_waiting",
                                                  "equivalence",
                                                  "throughput_timed",
                                                  "throughput_chosen",
                                                  "validation",
                                                  "ranks_step",
                                                  "rank_probe",
                                                  "saver_survey",
                                                  "memory_savers_changed",
                                                  "loss_scale_changed",
                                                  "allocator_segments",
                                                  "throughput_check"};
        const std::vector<Event> events = oneOfEach(std::make_index_sequence<std::variant_size_v<Event>>{});
        std::set<std::string> seen;
        for (const Event& event : events) {
            const std::string name = eventName(event);
            QVERIFY2(seen.insert(name).second, ("two event types are both written as " + name).c_str());
            QVERIFY2(documented.count(name) == 1, ("an event type written as \"" + name + "\", undocumented").c_str());
            // Written as one line of JSON whose type is that name.
            const std::string line = toJsonLine(event);
            QVERIFY(line.find('\n') == std::string::npos);
            const nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
            QVERIFY2(parsed.is_object(), line.c_str());
            QCOMPARE(parsed.value("type", std::string()), name);
        }
        QCOMPARE(seen, documented);
    }
};

}  // namespace tst_event_names

BATCHPILOT_TEST_MAIN(tst_event_names::TestEventNames)
#include "tst_event_names.moc"
