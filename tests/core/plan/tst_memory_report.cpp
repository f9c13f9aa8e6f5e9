#include <QtTest>
#include "tests/test_main.h"

#include "core/config/options.h"
#include "core/plan/memory_report.h"

namespace tst_memory_report {

using namespace batchpilot::core;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

/// The events of a small run: a probe with a fit, an OOM and one past the headroom line, then
/// the breakdowns of the step the probe ended in and of the next one.
std::vector<Event> probeAndSteps() {
    RunSummary summary;
    summary.device = "virtual:64MiB";
    summary.model = "cnn";
    summary.parameterCount = 24234;
    summary.targetBatch = 1024;
    ProbeStarted started{0.1, 1, ProbeReason::Initial, "virtual:64MiB", 1024, int64_t(60.8 * kMiB), 0};
    std::vector<Event> events{summary, started};
    events.push_back(ProbeTrial{0.2, 1, 1, 16, true, true, int64_t(4 * kMiB), 0, 0.01});
    events.push_back(ProbeTrial{0.3, 1, 2, 128, true, true, int64_t(29 * kMiB), 0, 0.05});
    events.push_back(ProbeTrial{0.4, 1, 3, 292, false, false, int64_t(60 * kMiB), int64_t(4.6 * kMiB), 0.1});
    events.push_back(ProbeTrial{0.5, 1, 4, 276, true, false, int64_t(62 * kMiB), 0, 0.1});
    events.push_back(ProbeFinished{0.6, 1, 271, 4, 1024, 4, 0.5, false, 0.44 * kMiB, 0.223 * kMiB});
    MemoryBreakdown first;
    first.step = 1;
    first.device = "virtual:64MiB";
    first.totalBytes = first.capacityBytes = int64_t(64 * kMiB);
    first.activationMicroBatch = 165;
    events.push_back(OptimizerStepped{0.7, 1, 6});
    events.push_back(first);
    MemoryBreakdown second = first;
    second.step = 2;
    second.parameterBytes = int64_t(0.09 * kMiB);
    second.gradientBytes = int64_t(0.09 * kMiB);
    second.optimizerStateBytes = int64_t(0.18 * kMiB);
    second.activationBytes = int64_t(57.08 * kMiB);
    second.activationMicroBatch = 256;
    second.inputBytes = int64_t(3 * kMiB);
    second.largestGradientBytes = int64_t(0.05 * kMiB);
    second.peakBytes = second.attributedBytes();
    second.freeBytes = second.totalBytes - second.peakBytes;
    events.push_back(OptimizerStepped{0.8, 2, 4});
    events.push_back(second);
    return events;
}

}  // namespace

class TestMemoryReport : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void fitInWords() {
        QCOMPARE(describeMemoryModel({210 * kMiB, 3.1 * kMiB}), std::string("≈ 210 MiB fixed + 3.1 MiB per sample"));
        QCOMPARE(describeMemoryModel({453 * 1024.0, 228 * 1024.0}),
                 std::string("≈ 453 KiB fixed + 228 KiB per sample"));
        QCOMPARE(describeMemoryModel({1.5 * 1024 * kMiB, 12 * kMiB}),
                 std::string("≈ 1.5 GiB fixed + 12 MiB per sample"));
        // A negative intercept is said plainly rather than printed as "fixed".
        QVERIFY(describeMemoryModel({-2 * kMiB, 1 * kMiB}).find("at zero") != std::string::npos);
    }

    void fitFromTrials() {
        // Exactly linear peaks: 10 MiB + 2 MiB per sample; the OOM is ignored.
        const std::vector<TrialOutcome> trials{{1, true, int64_t(12 * kMiB)},
                                               {4, true, int64_t(18 * kMiB)},
                                               {8, true, int64_t(26 * kMiB)},
                                               {64, false, 0}};
        const auto model = fitMemoryModel(trials);
        QVERIFY(model);
        QCOMPARE(qRound(model->fixedBytes / kMiB), 10);
        QCOMPARE(qRound(model->bytesPerSample / kMiB), 2);
        QVERIFY(!fitMemoryModel({{4, true, int64_t(18 * kMiB)}, {8, false, 0}}));
    }

    void fitSpreadsItsSizes() {
        // A probe on a real H200 capped to 4 GiB (scripts/gpu-check): reserved peaks move in 2 MiB
        // segments, so the three largest fits, 124 to 128 samples, put the slope anywhere (they
        // gave 42.5 MiB per sample, −1436 MiB fixed). The line goes through the largest fit and
        // the fits at most 80% of its size (the probe's reported line): here 64 and 128, by hand
        // (4022 − 1988) / 64 MiB.
        const std::vector<TrialOutcome> trials{{512, false, 0},
                                               {256, false, 0},
                                               {128, true, int64_t(4022 * kMiB)},
                                               {64, true, int64_t(1988 * kMiB)},
                                               {123, true, int64_t(3828 * kMiB)},
                                               {124, true, int64_t(3852 * kMiB)},
                                               {126, true, int64_t(3884 * kMiB)}};
        const auto model = fitMemoryModel(trials, 2, 0.8);
        QVERIFY(model);
        QCOMPARE(model->bytesPerSample, (4022.0 - 1988.0) / 64.0 * kMiB);
        QCOMPARE(model->fixedBytes, (1988.0 - 64.0 * (4022.0 - 1988.0) / 64.0) * kMiB);
        // Sizes all close together, nothing further down: the line takes them as they are.
        const auto close = fitMemoryModel({{100, true, int64_t(300 * kMiB)}, {110, true, int64_t(320 * kMiB)}}, 2, 0.8);
        QVERIFY(close);
        QCOMPARE(close->bytesPerSample, 2.0 * kMiB);
    }

    void whatIf() {
        const MemoryModel model{10 * kMiB, 2 * kMiB};
        const auto usable = int64_t(95 * kMiB);
        const auto capacity = int64_t(100 * kMiB);
        const WhatIf fits = predictWhatIf(model, 40, 1000, usable, capacity);  // 90 MiB
        QCOMPARE(fits.predictedPeakBytes, 90 * kMiB);
        QCOMPARE(fits.accumulationSteps, int64_t{25});
        QCOMPARE(fits.split.sum(), std::string("25 × 40"));
        QVERIFY(fits.fitsUsable && fits.fitsCapacity);
        const WhatIf pastHeadroom = predictWhatIf(model, 44, 1000, usable, capacity);  // 98 MiB
        QVERIFY(pastHeadroom.fitsCapacity && !pastHeadroom.fitsUsable);
        QCOMPARE(pastHeadroom.accumulationSteps, int64_t{23});  // 1000 = 11 × 44 + 12 × 43
        QCOMPARE(pastHeadroom.split.sum(), std::string("11 × 44 + 12 × 43"));
        const WhatIf tooBig = predictWhatIf(model, 100, 1000, usable, capacity);
        QVERIFY(!tooBig.fitsCapacity && !tooBig.fitsUsable);
        QCOMPARE(tooBig.accumulationSteps, int64_t{10});
        // The largest target at a micro-batch of 1: its 2^31 micro-batches are counted, not listed.
        const WhatIf largest = predictWhatIf(model, 1, kMaxTargetBatch, usable, capacity);
        QCOMPARE(largest.accumulationSteps, kMaxTargetBatch);
        QCOMPARE(largest.split.sum(), std::to_string(kMaxTargetBatch) + " × 1");
    }

    void partsStackInOrder() {
        MemoryBreakdown b;
        b.device = "virtual:64MiB";
        b.activationMicroBatch = 32;
        auto parts = memoryParts(b);
        QCOMPARE(int(parts.size()), 5);  // no cache or other processes on a virtual device
        QCOMPARE(parts[0].name, std::string("parameters"));
        QCOMPARE(parts[3].name, std::string("activations (micro-batch 32)"));
        QCOMPARE(parts[4].name, std::string("free"));
        for (const auto& part : parts) QVERIFY(!part.explanation.empty());
        b.device = "cuda:0";
        b.optimizerStateReserved = true;
        parts = memoryParts(b);
        QCOMPARE(int(parts.size()), 7);
        QCOMPARE(parts[2].name, std::string("optimizer state (reserved)"));
        QCOMPARE(parts[5].name, std::string("CUDA context and other processes"));

        // A peak that holds more than the four parts: the rest is its own part, on top of the
        // activations, so the parts still make the device's total.
        b.totalBytes = 100;
        b.parameterBytes = 10;
        b.gradientBytes = 10;
        b.optimizerStateBytes = 20;
        b.activationBytes = 30;
        b.peakBytes = 75;
        b.cacheBytes = 5;
        b.otherProcessBytes = 10;
        b.freeBytes = 10;
        parts = memoryParts(b);
        QCOMPARE(int(parts.size()), 8);
        QCOMPARE(parts[4].name, std::string("other resident"));
        QCOMPARE(parts[4].bytes, int64_t{5});
        int64_t sum = 0;
        for (const auto& part : parts) sum += part.bytes;
        QCOMPARE(sum, b.totalBytes);
    }

    void reportAfterTheFirstWholeStep() {
        MemoryReport report;
        const auto events = probeAndSteps();
        for (size_t i = 0; i + 1 < events.size(); ++i) {
            report.handle(events[i]);
            // The step the probe ended in also ran its trials: not representative.
            QVERIFY(!report.reportDue());
        }
        report.handle(events.back());
        QVERIFY(report.reportDue());
        const std::string text = report.take();
        QVERIFY(!report.reportDue());
        for (const char* expected :
             {"cnn (24,234 parameters) on virtual:64MiB", "out of memory", "fits, past headroom", "failed to get 4.6",
              "≈ 451 KiB fixed + 228 KiB per sample", "Chosen micro-batch 271: target 1024 = 4 micro-batch(es) of 256",
              "after step 2", "activations (micro-batch 256)", "optimizer state", "(100.0%)",
              // The fixed part in words: what stays, and the gradient in flight during backward.
              "fixed: parameters, gradients and optimizer state (368.6 KiB)", "up to 51.2 KiB",
              // The input batch is its own part, not activations.
              "input batch                        3.00"}) {
            QVERIFY2(text.find(expected) != std::string::npos, (text + "\nmissing: " + expected).c_str());
        }
        // One row per trial, in order.
        QVERIFY(text.find("     16") < text.find("    128"));
        QVERIFY(text.find("    292") < text.find("    276"));
    }

    /// Objective "fastest": the report waits for the search's decision and the first whole step
    /// after it, and says why the chosen size is not the largest that fits.
    void fastestWaitsForTheDecision() {
        MemoryReport report;
        auto events = probeAndSteps();
        events.resize(events.size() - 2);  // up to step 1's breakdown
        // Timing starts in step 2: 256 (the probe's size, warm) twice, then 128.
        events.insert(events.end() - 2, ThroughputTimed{0.65, 1, 256, 2000, 1});
        for (const auto& e : events) report.handle(e);
        report.handle(ThroughputTimed{0.7, 1, 256, 2100, 2});
        report.handle(ThroughputTimed{0.75, 1, 128, 0, 0});
        report.handle(ThroughputTimed{0.8, 1, 128, 3000, 1});
        MemoryBreakdown step2;
        step2.step = 2;
        step2.device = "virtual:64MiB";
        step2.totalBytes = step2.capacityBytes = int64_t(64 * kMiB);
        report.handle(OptimizerStepped{0.85, 2, 5});
        report.handle(step2);
        QVERIFY2(!report.reportDue(), "still timing: the report would not explain the choice yet");
        report.handle(ThroughputTimed{0.9, 1, 128, 3100, 2});
        const std::string reason = "micro-batch 128 at 3100 samples/s, 48% faster than the largest that fits";
        report.handle(
            ThroughputChosen{0.9, 1, 128, 256, 8, 1024, 3100, 2100, 1.45, 1.3, 0.05, 0.001, 6, 0.3, reason, {}, 0});
        MemoryBreakdown step3 = step2;
        step3.step = 3;
        report.handle(OptimizerStepped{0.95, 3, 8});
        report.handle(step3);
        QVERIFY2(!report.reportDue(), "step 3 held the decision: the first whole step at 128 is step 4");
        MemoryBreakdown step4 = step2;
        step4.step = 4;
        report.handle(OptimizerStepped{1.0, 4, 8});
        report.handle(step4);
        QVERIFY(report.reportDue());
        const std::string text = report.take();
        for (const char* expected : {"Largest that fits 271: target 1024 = 4 micro-batch(es) of 256",
                                     "timed on 6 training micro-batches in 0.30 s (all of them trained)",
                                     "Chosen micro-batch 128: target 1024 = 8 micro-batch(es) of 128",
                                     "Not the largest that fits (256): micro-batch 128 at 3100 samples/s"}) {
            QVERIFY2(text.find(expected) != std::string::npos, (text + "\nmissing: " + expected).c_str());
        }
        // One row per size with its latest median, the chosen one marked.
        QVERIFY2(text.find("2100") != std::string::npos && text.find("2000") == std::string::npos, text.c_str());
        QVERIFY2(text.find("3100        2  <- chosen") != std::string::npos, text.c_str());
    }

    void runEndingEarlyStillReports() {
        MemoryReport report;
        auto events = probeAndSteps();
        events.resize(events.size() - 2);  // the run ended after step 1
        for (const auto& e : events) report.handle(e);
        QVERIFY(!report.reportDue());
        report.handle(RunStateChanged{1.0, RunState::Finished, "done"});
        QVERIFY(report.reportDue());
        QVERIFY(report.take().find("after step 1") != std::string::npos);
    }
};

}  // namespace tst_memory_report

BATCHPILOT_TEST_MAIN(tst_memory_report::TestMemoryReport)
#include "tst_memory_report.moc"
