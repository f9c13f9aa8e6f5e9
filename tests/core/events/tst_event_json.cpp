// Reading events back (core/events/event_json.h): every type, every field, as the events file
// holds it. The reference is the file format itself: lines the writer wrote before the reader
// existed (kWrittenLines, fixed here), which must read back into the same events and be written
// again byte for byte; and the reader's answer to what a damaged or foreign file holds.

#include <QtTest>
#include "tests/test_main.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/events/event_json.h"
#include "core/events/events.h"
#include "tests/core/events/sample_events.h"

namespace tst_event_json {

using namespace batchpilot::core;
using nlohmann::json;

namespace {

// What toJsonLine wrote of batchpilot::test::sampleEvents() when the reader was added: one line
// per event, in order. A change here is a change of the events file format (docs/reference/events.md).
const char* const kWrittenLines[] = {
    "{\"detail\":\"virtual:64MiB, cnn\",\"state\":\"training\",\"time\":0.5,\"type\":\"state\"}",
    "{\"detail\":\"out of memory \\\"quoted\\\"\\nsecond line\",\"state\":\"failed\",\"time\":1.25,\"type\":\"state\"}",
    "{\"device\":\"virtual:64MiB\",\"reason\":\"memory savers turned "
    "on\",\"reserved_bytes\":4096,\"sequence\":3,\"time\":2.5,\"type\":\"probe_started\",\"upper_bound\":1024,\"usable_"
    "bytes\":60000000}",
    "{\"failed_allocation_bytes\":0,\"fit\":true,\"micro_batch\":512,\"peak_bytes\":33554432,\"seconds\":0.125,"
    "\"sequence\":3,\"time\":3.5,\"trial\":2,\"type\":\"probe_trial\",\"within_headroom\":true}",
    "{\"failed_allocation_bytes\":20971520,\"fit\":false,\"micro_batch\":1024,\"peak_bytes\":0,\"seconds\":0.0625,"
    "\"sequence\":3,\"time\":3.75,\"trial\":3,\"type\":\"probe_trial\",\"within_headroom\":false}",
    "{\"accumulation_steps\":4,\"bytes_per_sample\":65536.5,\"fixed_bytes\":12500000.0,\"hit_trial_limit\":true,"
    "\"micro_batch\":300,\"seconds\":1.5,\"sequence\":3,\"target_batch\":1200,\"time\":4.5,\"trials\":7,\"type\":"
    "\"probe_finished\"}",
    "{\"micro_batch\":128,\"repetitions\":3,\"samples_per_second\":1534.25,\"sequence\":2,\"time\":5.5,\"type\":"
    "\"throughput_timed\"}",
    "{\"gain\":1.0625,\"gain_high\":1.125,\"gain_low\":0.96875,\"largest_micro_batch\":256,\"micro_batch\":64,"
    "\"ratio\":0.96875,\"sequence\":2,\"time\":6.625,\"turn\":3,\"type\":\"throughput_check\"}",
    "{\"accumulation_steps\":16,\"largest_micro_batch\":256,\"largest_samples_per_second\":1500.25,\"micro_batch\":64,"
    "\"micro_batch_seconds\":0.001953125,\"micro_batches_timed\":24,\"reason\":\"64 is 12% faster per training "
    "batch\",\"samples_per_second\":1800.5,\"seconds\":3.75,\"sequence\":2,\"speed_over_largest\":1.2,\"step_seconds\":"
    "0.03125,\"step_speed_over_largest\":1.125,\"target_batch\":1024,\"time\":6.5,\"type\":\"throughput_chosen\"}",
    "{\"accumulation_steps\":16,\"batch_gain_high\":1.125,\"batch_gain_low\":0.96875,\"batch_ratios\":[1.0625,"
    "1.125,0.96875],\"check_seconds\":21.5,\"largest_micro_batch\":256,\"largest_samples_per_second\":1500.25,\"micro_"
    "batch\":64,\"micro_batch_seconds\":0.001953125,"
    "\"micro_batches_timed\":24,\"reason\":\"64 is 12% faster per training batch\",\"samples_per_second\":1800.5,"
    "\"seconds\":3.75,\"sequence\":2,\"speed_over_largest\":1.2,\"step_seconds\":0.03125,\"step_speed_over_"
    "largest\":1.0625,\"target_batch\":1024,\"time\":6.75,\"type\":\"throughput_chosen\"}",
    "{\"message\":\"CUDA out of "
    "memory\",\"micro_batch\":256,\"new_micro_batch\":128,\"phase\":\"backward\",\"recovered\":true,\"redone_samples\":"
    "512,\"requested_bytes\":8388608,\"snapshot_file\":\"oom-snapshot-rank0-01.pickle\",\"step\":12,\"time\":7.5,"
    "\"type\":\"oom\"}",
    "{\"message\":\"\",\"micro_batch\":64,\"new_micro_batch\":0,\"phase\":\"host-to-device "
    "copy\",\"recovered\":false,\"redone_samples\":0,\"requested_bytes\":0,\"step\":13,\"time\":7.75,\"type\":\"oom\"}",
    "{\"allocated_bytes\":1000000,\"capacity_bytes\":67108864,\"headroom_bytes\":60397977,\"peak_bytes\":3000000,"
    "\"reserved_bytes\":2097152,\"time\":8.5,\"type\":\"memory\"}",
    "{\"accumulation_steps\":4,\"epoch\":2,\"learning_rate\":0.003,\"loss\":2.302585,\"micro_batch\":256,\"peak_"
    "bytes\":41943040,\"samples_per_second\":1234.5,\"samples_seen\":14336,\"step\":14,\"step_seconds\":0.83,\"target_"
    "batch\":1024,\"time\":9.5,\"total_steps\":100,\"type\":\"step\"}",
    "{\"index\":2,\"loss\":2.25,\"loss_weight\":0.25,\"offset\":512,\"probe_trial\":true,\"size\":256,\"step\":14,"
    "\"target_batch\":1024,\"time\":10.5,\"type\":\"micro_batch\"}",
    "{\"gradient_norm\":0.875,\"index\":2,\"loss\":2.25,\"loss_weight\":0.25,\"offset\":512,\"probe_trial\":false,"
    "\"sample_indices\":[5,3,9,0],\"size\":256,\"step\":14,\"target_batch\":1024,\"time\":10.75,\"type\":\"micro_"
    "batch\"}",
    "{\"micro_batches\":4,\"step\":14,\"time\":11.5,\"type\":\"optimizer_step\"}",
    "{\"new_learning_rate\":0.004,\"new_target\":4096,\"old_learning_rate\":0.001,\"old_target\":1024,\"time\":12.5,"
    "\"type\":\"target_batch\"}",
    "{\"from\":\"virtual:64MiB\",\"rank\":1,\"time\":13.5,\"to\":\"virtual:32MiB\",\"type\":\"device_switch\"}",
    "{\"message\":\"the data set's last batch is short\",\"time\":14.5,\"type\":\"warning\"}",
    "{\"path\":\"runs/a/checkpoint/checkpoint.pt\",\"step\":20,\"time\":15.5,\"type\":\"checkpoint\"}",
    "{\"metric\":\"val_accuracy\",\"path\":\"runs/a/checkpoint/best/"
    "checkpoint.pt\",\"step\":20,\"time\":15.75,\"type\":\"checkpoint\",\"value\":0.75}",
    "{\"message\":\"the model does not fit\",\"time\":16.5,\"type\":\"error\",\"where\":\"step 3, micro-batch 2 (32 "
    "samples), forward\"}",
    "{\"batch_statistics\":true,\"dataset\":\"synthetic\",\"dataset_size\":50000,\"device\":\"virtual:64MiB\",\"input_"
    "shape\":[3,32,32],\"loss\":\"cross-entropy\",\"model\":\"cnn\",\"optimizer\":\"adam, learning rate "
    "0.003\",\"parameter_count\":62006,\"parameter_tensors\":10,\"target_batch\":1024,\"time\":17.5,\"type\":\"run_"
    "summary\"}",
    "{\"activation_bytes\":30000000,\"activation_micro_batch\":256,\"buffer_copy_bytes\":1024,\"cache_bytes\":2097152,"
    "\"capacity_bytes\":66000000,\"context_bytes\":300000000,\"device\":\"virtual:64MiB/"
    "caching\",\"free_bytes\":12345,\"gradient_bytes\":248025,\"input_bytes\":3145728,\"largest_gradient_bytes\":73728,"
    "\"memory_savers\":\"checkpoint\",\"optimizer_state_bytes\":496048,\"optimizer_state_reserved\":true,\"other_"
    "process_bytes\":512,\"parameter_bytes\":248024,\"peak_bytes\":35000000,\"resident_bytes\":1000000,\"step\":14,"
    "\"time\":18.5,\"total_bytes\":67108864,\"type\":\"memory_breakdown\",\"usable_bytes\":59400000,\"workspace_"
    "bytes\":8519680}",
    "{\"activation_bytes\":30000000,\"activation_micro_batch\":256,\"buffer_copy_bytes\":1024,\"cache_bytes\":2097152,"
    "\"capacity_bytes\":66000000,\"context_bytes\":300000000,\"device\":\"virtual:64MiB/"
    "caching\",\"free_bytes\":12345,\"gradient_bytes\":248025,\"input_bytes\":3145728,\"largest_gradient_bytes\":73728,"
    "\"memory_savers\":\"off\",\"optimizer_state_bytes\":496048,\"optimizer_state_reserved\":true,\"other_process_"
    "bytes\":512,\"parameter_bytes\":248024,\"peak_bytes\":35000000,\"resident_bytes\":1000000,\"step\":14,\"time\":18."
    "75,\"total_bytes\":67108864,\"type\":\"memory_breakdown\",\"usable_bytes\":59400000,\"workspace_bytes\":8519680}",
    "{\"index\":1,\"offset\":256,\"probe_trial\":true,\"size\":256,\"step\":15,\"target_batch\":1024,\"time\":19.5,"
    "\"type\":\"step_mode_waiting\"}",
    "{\"batch_statistics\":true,\"bfloat16\":true,\"explanation\":\"equal up to float32 "
    "rounding\",\"float16\":false,\"full_pass_outside_budget\":true,\"micro_batch_sizes\":[256,256,256,256],"
    "\"overall\":{\"cosine_similarity\":0.99999995,\"elements\":62006,\"max_abs_difference\":3e-08,\"name\":\"all "
    "parameters\",\"relative_difference\":4.5e-07},\"running_statistics_relative_difference\":2.5e-07,\"samples\":1024,"
    "\"seconds\":0.75,\"step\":15,\"tensors\":[{\"cosine_similarity\":0.9999999,\"elements\":864,\"max_abs_"
    "difference\":1.5e-08,\"name\":\"conv1.weight\",\"relative_difference\":2.5e-07},{\"cosine_similarity\":1.0,"
    "\"elements\":10,\"max_abs_difference\":0.0,\"name\":\"fc.bias\",\"relative_difference\":0.0}],\"time\":20.5,"
    "\"type\":\"equivalence\"}",
    "{\"batch_statistics\":true,\"bfloat16\":true,\"error\":\"the full pass did not fit\",\"explanation\":\"equal up "
    "to float32 "
    "rounding\",\"float16\":true,\"full_pass_outside_budget\":true,\"micro_batch_sizes\":[256,256,256,256],\"overall\":"
    "{\"cosine_similarity\":0.99999995,\"elements\":62006,\"max_abs_difference\":3e-08,\"name\":\"all "
    "parameters\",\"relative_difference\":4.5e-07},\"ranks\":[{\"device\":\"virtual:48MiB\",\"micro_batch_sizes\":[256,"
    "256],\"rank\":0},{\"device\":\"virtual:192MiB\",\"micro_batch_sizes\":[512],\"rank\":1}],\"samples\":1024,"
    "\"seconds\":0.75,\"step\":15,\"tensors\":[{\"cosine_similarity\":0.9999999,\"elements\":864,\"max_abs_"
    "difference\":1.5e-08,\"name\":\"conv1.weight\",\"relative_difference\":2.5e-07},{\"cosine_similarity\":1.0,"
    "\"elements\":10,\"max_abs_difference\":0.0,\"name\":\"fc.bias\",\"relative_difference\":0.0}],\"time\":20.75,"
    "\"type\":\"equivalence\"}",
    "{\"accuracy\":0.625,\"epoch\":1,\"loss\":1.75,\"micro_batch\":500,\"ooms\":1,\"samples\":5000,\"samples_seen\":"
    "16384,\"seconds\":2.5,\"step\":16,\"time\":21.5,\"top5_accuracy\":0.875,\"type\":\"validation\"}",
    "{\"epoch\":1,\"loss\":0.5,\"mae\":0.375,\"micro_batch\":500,\"mse\":0.25,\"ooms\":0,\"samples\":5000,\"samples_"
    "seen\":16384,\"seconds\":2.5,\"step\":16,\"time\":21.75,\"type\":\"validation\"}",
    "{\"all_reduce_seconds\":0.015625,\"collectives\":\"Gloo\",\"collectives_why\":\"the ranks are not all on GPUs of "
    "their "
    "own\",\"imbalance\":1.25,\"next_shares\":[320,704],\"parameters_checked\":true,\"ranks\":[{\"compute_seconds\":0."
    "5,\"device\":\"virtual:48MiB\",\"micro_batch\":128,\"micro_batches\":2,\"ooms\":1,\"peak_bytes\":40000000,"
    "\"rank\":0,\"samples_per_second\":512.0,\"settled\":true,\"share\":256,\"wait_seconds\":0.125},{\"compute_"
    "seconds\":0.625,\"device\":\"virtual:192MiB\",\"micro_batch\":768,\"micro_batches\":1,\"ooms\":0,\"peak_bytes\":"
    "150000000,\"rank\":1,\"samples_per_second\":1228.8,\"settled\":false,\"share\":768,\"wait_seconds\":0.0}],\"share_"
    "reason\":\"rank 1 is faster\",\"step\":16,\"time\":22.5,\"type\":\"ranks_step\"}",
    "{\"all_reduce_seconds\":0.015625,\"collectives\":\"Gloo\",\"imbalance\":1.25,\"parameters_checked\":false,"
    "\"ranks\":[{\"compute_seconds\":0.5,\"device\":\"virtual:48MiB\",\"micro_batch\":128,\"micro_batches\":2,\"ooms\":"
    "1,\"peak_bytes\":40000000,\"rank\":0,\"samples_per_second\":512.0,\"settled\":true,\"share\":256,\"wait_seconds\":"
    "0.125},{\"compute_seconds\":0.625,\"device\":\"virtual:192MiB\",\"micro_batch\":768,\"micro_batches\":1,\"ooms\":"
    "0,\"peak_bytes\":150000000,\"rank\":1,\"samples_per_second\":1228.8,\"settled\":false,\"share\":768,\"wait_"
    "seconds\":0.0}],\"step\":16,\"time\":22.75,\"type\":\"ranks_step\"}",
    "{\"device\":\"virtual:192MiB\",\"finished\":[{\"accumulation_steps\":1,\"bytes_per_sample\":0.0,\"fixed_bytes\":0."
    "0,\"hit_trial_limit\":false,\"micro_batch\":768,\"seconds\":0.25,\"sequence\":1,\"target_batch\":768,\"time\":23."
    "4,\"trials\":1}],\"ooms\":[{\"message\":\"oom\",\"micro_batch\":768,\"new_micro_batch\":384,\"phase\":\"optimizer "
    "step\",\"recovered\":true,\"redone_samples\":0,\"requested_bytes\":1024,\"step\":16,\"time\":23.45}],\"probes\":[{"
    "\"device\":\"virtual:192MiB\",\"reason\":\"device "
    "switch\",\"reserved_bytes\":0,\"sequence\":1,\"time\":23.25,\"upper_bound\":768,\"usable_bytes\":190000000}],"
    "\"rank\":1,\"time\":23.5,\"trials\":[{\"failed_allocation_bytes\":0,\"fit\":true,\"micro_batch\":768,\"peak_"
    "bytes\":150000000,\"seconds\":0.25,\"sequence\":1,\"time\":23.3,\"trial\":1,\"within_headroom\":true}],\"type\":"
    "\"rank_probe\"}",
    "{\"advice\":\"bf16 trains 30% faster "
    "here\",\"current\":\"off\",\"device\":\"virtual:64MiB\",\"options\":[{\"accumulation_steps\":22,\"bytes_per_"
    "sample\":40000.5,\"fits\":true,\"fixed_bytes\":1250000.0,\"micro_batch\":48,\"peak_bytes\":58000000,\"samples_per_"
    "second\":900.5,\"savers\":\"off\",\"timed_micro_batch\":48,\"trials\":3},{\"fits\":false,\"savers\":"
    "\"checkpoint\",\"unavailable\":\"the model cannot be split\"}],\"reason\":\"the probe found a small "
    "micro-batch\",\"seconds\":1.5,\"step\":17,\"suggestion\":\"bf16\",\"target_batch\":1024,\"time\":24.5,\"type\":"
    "\"saver_survey\",\"usable_bytes\":59400000}",
    "{\"from\":\"off\",\"predicted_micro_batch\":96,\"step\":17,\"time\":25.5,\"to\":\"bf16\",\"type\":\"memory_savers_"
    "changed\",\"why\":\"the survey's suggestion\"}",
    "{\"from\":65536.0,\"overflow\":true,\"redone_samples\":1024,\"step\":18,\"time\":26.5,\"to\":32768.0,\"type\":"
    "\"loss_scale_changed\"}",
    "{\"at_oom\":false,\"limit_bytes\":67108864,\"segments\":[{\"address\":1048576,\"blocks\":[{\"allocat"
    "ed\":true,\"bytes\":512,\"offset\":0,\"requested_bytes\":500},{\"allocated\":false,\"bytes\":2096640"
    ",\"offset\":512,\"requested_bytes\":0}],\"bytes\":2097152,\"expandable\":false,\"small_pool\":true},"
    "{\"address\":4194304,\"blocks\":[{\"allocated\":true,\"bytes\":10485760,\"offset\":0,\"requested_byt"
    "es\":10000000},{\"allocated\":false,\"bytes\":10485760,\"offset\":10485760,\"requested_bytes\":0}],"
    "\"bytes\":20971520,\"expandable\":false,\"small_pool\":false}],\"step\":18,\"time\":27.5,\"type\":\""
    "allocator_segments\"}",
    "{\"at_oom\":true,\"fragmentation\":true,\"largest_free_block\":20971520,\"limit_bytes\":67108864,\"r"
    "equested_bytes\":30000000,\"segment_bytes\":41943040,\"segments\":[{\"address\":67108864,\"blocks\":"
    "[{\"allocated\":true,\"bytes\":20971520,\"offset\":0,\"requested_bytes\":20000000},{\"allocated\":fa"
    "lse,\"bytes\":20971520,\"offset\":20971520,\"requested_bytes\":0},{\"allocated\":false,\"bytes\":209"
    "71520,\"mapped\":false,\"offset\":41943040,\"requested_bytes\":0}],\"bytes\":41943040,\"expandable\""
    ":true,\"small_pool\":false}],\"step\":18,\"time\":27.75,\"type\":\"allocator_segments\"}",
};

std::vector<std::string> writtenLines() {
    return {std::begin(kWrittenLines), std::end(kWrittenLines)};
}

std::string readError(const std::string& line) {
    const auto event = eventFromJsonLine(line);
    return event ? std::string("(read without error)") : event.error();
}

}  // namespace

class TestEventJson : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void writerKeepsTheFormat() {
        // Every field of every type, and the fields written only when they apply, both ways.
        const std::vector<Event> events = batchpilot::test::sampleEvents();
        const std::vector<std::string> lines = writtenLines();
        QCOMPARE(events.size(), lines.size());
        for (size_t i = 0; i < events.size(); ++i) QCOMPARE(toJsonLine(events[i]), lines[i]);
        // Every type is there.
        std::set<size_t> types;
        for (const Event& event : events) types.insert(event.index());
        QCOMPARE(types.size(), std::variant_size_v<Event>);
    }

    void everyLineReadsBackToTheSameEvent() {
        // Read, then written again: the same bytes — every key read into the field it came from
        // (a key read into another field, or not read, would write a different line).
        for (const std::string& line : writtenLines()) {
            const auto event = eventFromJsonLine(line);
            QVERIFY2(event.has_value(), (line + ": " + (event ? "" : event.error())).c_str());
            QCOMPARE(toJsonLine(*event), line);
        }
        // And field by field for a few whose values the line alone shows.
        const auto oom = eventFromJsonLine(
            R"({"message":"CUDA out of memory","micro_batch":256,"new_micro_batch":128,"phase":"backward",)"
            R"("recovered":true,"redone_samples":512,"requested_bytes":8388608,"step":12,"time":7.5,"type":"oom"})");
        QVERIFY(oom.has_value());
        const auto& o = std::get<OomEvent>(*oom);
        QCOMPARE(o.phase, Phase::Backward);
        QCOMPARE(o.microBatch, int64_t{256});
        QCOMPARE(o.newMicroBatch, int64_t{128});
        QCOMPARE(o.redoneSamples, int64_t{512});
        QCOMPARE(o.requestedBytes, int64_t{8388608});
        QCOMPARE(o.message, std::string("CUDA out of memory"));
        QCOMPARE(o.time, 7.5);
        const auto breakdown = eventFromJsonLine(R"({"memory_savers":"off","peak_bytes":5,"type":"memory_breakdown"})");
        QVERIFY(breakdown.has_value());
        QCOMPARE(std::get<MemoryBreakdown>(*breakdown).memorySavers, std::string());  // none is written "off"
        QCOMPARE(std::get<MemoryBreakdown>(*breakdown).peakBytes, int64_t{5});
        const auto check = eventFromJsonLine(
            R"({"ranks":[{"device":"a","micro_batch_sizes":[4,4],"rank":0},{"device":"b","micro_batch_sizes":[8],)"
            R"("rank":1}],"type":"equivalence"})");
        QVERIFY(check.has_value());
        const auto& c = std::get<EquivalenceChecked>(*check);
        QCOMPARE(c.rankDevices, (std::vector<std::string>{"a", "b"}));
        QCOMPARE(c.rankMicroBatchSizes, (std::vector<std::vector<int64_t>>{{4, 4}, {8}}));
        QCOMPARE(c.runningStatisticsRelativeDifference, -1.0);  // absent: no BatchNorm
    }

    void olderFilesReadWithDefaults() {
        // A field added later is absent from older runs' files: its default, not an error.
        const auto oom =
            eventFromJsonLine(R"({"message":"","micro_batch":8,"new_micro_batch":4,"phase":"forward","recovered":true,)"
                              R"("requested_bytes":0,"step":1,"time":1,"type":"oom"})");
        QVERIFY(oom.has_value());
        QCOMPARE(std::get<OomEvent>(*oom).redoneSamples, int64_t{0});
        const auto validation = eventFromJsonLine(R"({"loss":0.5,"step":3,"type":"validation"})");
        QVERIFY(validation.has_value());
        QCOMPARE(std::get<ValidationDone>(*validation).accuracy, -1.0);  // absent: not class ids
        // Keys a newer BatchPilot adds are passed over.
        const auto step = eventFromJsonLine(R"({"loss":2.5,"step":7,"type":"step","wall_clock":"12:00"})");
        QVERIFY(step.has_value());
        QCOMPARE(std::get<StepMetrics>(*step).step, int64_t{7});
        // A NaN loss is written as null (JSON has no NaN) and read back as NaN.
        StepMetrics diverged;
        diverged.loss = std::nan("");
        const std::string line = toJsonLine(diverged);
        QVERIFY2(line.find("\"loss\":null") != std::string::npos, line.c_str());
        const auto back = eventFromJsonLine(line);
        QVERIFY(back.has_value());
        QVERIFY(std::isnan(std::get<StepMetrics>(*back).loss));
    }

    void damageIsNamed_data() {
        QTest::addColumn<QString>("line");
        QTest::addColumn<QString>("named");
        const auto row = [](const char* name, const std::string& line, const char* named) {
            QTest::newRow(name) << QString::fromStdString(line) << QString::fromUtf8(named);
        };
        row("cut off", R"({"type":"step","loss":2.)", "not JSON");
        row("not an object", "[1,2,3]", "not a JSON object");
        row("no type", R"({"step":1})", "no \"type\"");
        row("unknown type", R"({"type":"teleport"})", "unknown type \"teleport\"");
        row("text for a number", R"({"type":"step","loss":"low"})", "step \"loss\": not a number");
        row("fraction for a count", R"({"type":"step","step":2.5})", "step \"step\": not a whole number");
        row("count too large for its field", R"({"type":"probe_trial","trial":4294967296})",
            "probe_trial \"trial\": too large");
        row("number for text", R"({"type":"warning","message":7})", "warning \"message\": not a string");
        row("text for a flag", R"({"type":"oom","recovered":"yes"})", "oom \"recovered\": not true or false");
        row("unknown phase", R"({"type":"oom","phase":"sideways"})", "oom \"phase\": unknown phase \"sideways\"");
        row("unknown state", R"({"type":"state","state":"dreaming"})", "state \"state\": unknown state \"dreaming\"");
        row("inside a list", R"({"type":"ranks_step","ranks":[{"rank":0},{"share":"half"}]})",
            "ranks_step \"ranks[1].share\": not a whole number");
        row("a list that is not", R"({"type":"run_summary","input_shape":3})",
            "run_summary \"input_shape\": not a list");
        row("too deep", R"({"type":"warning","message":)" + std::string(40, '[') + std::string(40, ']') + "}",
            "nested deeper than 16");
    }
    void damageIsNamed() {
        QFETCH(QString, line);
        QFETCH(QString, named);
        const std::string error = readError(line.toStdString());
        QVERIFY2(error.find(named.toStdString()) != std::string::npos, error.c_str());
    }

    void numbersNoRunCanHaveAreRefused_data() {
        // What a run can claim is what its options allow (a target batch up to 2^31 samples, 2^40
        // steps, 256 devices, 1,000 trials a probe): beyond, the line is not an event, whatever
        // it would cost the views (a plan of 2^63 micro-batches aborted the window).
        QTest::addColumn<QString>("line");
        QTest::addColumn<QString>("named");
        const auto row = [](const char* name, const std::string& line, const char* named) {
            QTest::newRow(name) << QString::fromStdString(line) << QString::fromUtf8(named);
        };
        row("target 2^63-1", R"({"type":"step","step":3,"target_batch":9223372036854775807})",
            "step \"target_batch\": 9223372036854775807 cannot be a number of samples (0 to 2147483648)");
        row("step 2^63-1", R"({"type":"step","step":9223372036854775807})",
            "step \"step\": 9223372036854775807 cannot be an optimizer step (0 to 1099511627776)");
        row("negative step", R"({"type":"optimizer_step","step":-1})",
            "optimizer_step \"step\": -1 cannot be an optimizer step");
        row("share past the largest batch",
            R"({"type":"ranks_step","ranks":[{"rank":0},{"rank":1,"share":2147483649}]})",
            "ranks_step \"ranks[1].share\": 2147483649 cannot be a number of samples");
        std::string many = R"({"type":"ranks_step","ranks":[)";
        for (int r = 0; r < 257; ++r) many += (r ? ",{\"rank\":" : "{\"rank\":") + std::to_string(r % 256) + "}";
        row("257 ranks", many + "]}", "ranks_step \"ranks\": 257 ranks, more than a run can have (256)");
        row("rank 256", R"({"type":"device_switch","rank":256})",
            "device_switch \"rank\": 256 cannot be a rank (0 to 255)");
        row("next share", R"({"type":"ranks_step","next_shares":[16,-16],"share_reason":"x"})",
            "ranks_step \"next_shares[1]\": -16 cannot be a number of samples");
        row("trial 1001", R"({"type":"probe_trial","trial":1001})",
            "probe_trial \"trial\": 1001 cannot be a probe's trial count (0 to 1000)");
        row("a rank's micro-batch sizes", R"({"type":"equivalence","ranks":[{"rank":0,"micro_batch_sizes":[8,-8]}]})",
            "equivalence \"ranks[0].micro_batch_sizes[1]\": -8 cannot be a number of samples");
        row("a check's micro-batch sizes", R"({"type":"equivalence","micro_batch_sizes":[4294967296]})",
            "equivalence \"micro_batch_sizes[0]\": 4294967296 cannot be a number of samples");
        row("a rank's report", R"({"type":"rank_probe","rank":300})", "rank_probe \"rank\": 300 cannot be a rank");
    }
    void numbersNoRunCanHaveAreRefused() {
        QFETCH(QString, line);
        QFETCH(QString, named);
        const std::string error = readError(line.toStdString());
        QVERIFY2(error.find(named.toStdString()) != std::string::npos, error.c_str());
    }

    void theLargestNumbersARunCanHaveAreRead() {
        const auto step = eventFromJsonLine(
            R"({"type":"step","step":1099511627776,"target_batch":2147483648,"micro_batch":1,"accumulation_steps":2147483648})");
        QVERIFY2(step.has_value(), step ? "" : step.error().c_str());
        QCOMPARE(std::get<StepMetrics>(*step).targetBatch, int64_t{1} << 31);
        std::string ranks = R"({"type":"ranks_step","ranks":[)";
        for (int r = 0; r < 256; ++r)
            ranks += (r ? ",{\"rank\":" : "{\"rank\":") + std::to_string(r) + ",\"share\":2147483648}";
        const auto stepped = eventFromJsonLine(ranks + "]}");
        QVERIFY2(stepped.has_value(), stepped ? "" : stepped.error().c_str());
        QCOMPARE(std::get<RanksStepped>(*stepped).ranks.size(), size_t{256});
        QVERIFY(eventFromJsonLine(R"({"type":"probe_trial","trial":1000})").has_value());
    }

    void missingFieldsWhenAsked() {
        // A rank's report is written by this very build: a field it lacks is an error there.
        const json partial = json::parse(R"({"type":"probe_trial","time":1,"sequence":1,"trial":1})");
        QVERIFY(eventFromJson(partial).has_value());
        const auto strict = eventFromJson(partial, MissingFields::Error);
        QVERIFY(!strict.has_value());
        QVERIFY2(strict.error().find("\"micro_batch\": missing") != std::string::npos, strict.error().c_str());
        // Fields written only where they apply are never missing.
        for (const std::string& line : writtenLines()) {
            const auto event = eventFromJson(json::parse(line), MissingFields::Error);
            QVERIFY2(event.has_value(), (line + ": " + (event ? "" : event.error())).c_str());
        }
    }
};

}  // namespace tst_event_json

BATCHPILOT_TEST_MAIN(tst_event_json::TestEventJson)
#include "tst_event_json.moc"
