#pragma once

// One event of every type with every field set to a value that is not its default (and, for the
// fields written only when they apply, the variants where they do and do not), for the events
// file's tests: what toJsonLine writes of them is fixed in event_lines.jsonl.

#include <vector>

#include "core/events/events.h"

namespace batchpilot::test {

inline std::vector<core::Event> sampleEvents() {
    using namespace batchpilot::core;
    std::vector<Event> events;
    events.push_back(RunStateChanged{0.5, RunState::Training, "virtual:64MiB, cnn"});
    events.push_back(RunStateChanged{1.25, RunState::Failed, "out of memory \"quoted\"\nsecond line"});
    events.push_back(ProbeStarted{2.5, 3, ProbeReason::MemorySavers, "virtual:64MiB", 1024, 60000000, 4096});
    events.push_back(ProbeTrial{3.5, 3, 2, 512, true, true, 33554432, 0, 0.125});
    events.push_back(ProbeTrial{3.75, 3, 3, 1024, false, false, 0, 20971520, 0.0625});
    events.push_back(ProbeFinished{4.5, 3, 300, 4, 1200, 7, 1.5, true, 1.25e7, 65536.5});
    events.push_back(ThroughputTimed{5.5, 2, 128, 1534.25, 3});
    events.push_back(ThroughputChecked{6.625, 2, 64, 256, 3, 0.96875, 1.0625, 0.96875, 1.125});
    {
        ThroughputChosen e;
        e.time = 6.5;
        e.sequence = 2;
        e.microBatch = 64;
        e.largestMicroBatch = 256;
        e.accumulationSteps = 16;
        e.targetBatch = 1024;
        e.samplesPerSecond = 1800.5;
        e.largestSamplesPerSecond = 1500.25;
        e.speedOverLargest = 1.2;
        e.stepSpeedOverLargest = 1.125;
        e.stepSeconds = 0.03125;
        e.microBatchSeconds = 0.001953125;
        e.microBatchesTimed = 24;
        e.seconds = 3.75;
        e.reason = "64 is 12% faster per training batch";
        events.push_back(e);
        // Checked on whole training batches: the turns' ratios, their interval and the check's time are written.
        e.time = 6.75;
        e.stepSpeedOverLargest = 1.0625;
        e.batchRatios = {1.0625, 1.125, 0.96875};
        e.batchGainLow = 0.96875;
        e.batchGainHigh = 1.125;
        e.checkSeconds = 21.5;
        events.push_back(e);
    }
    events.push_back(OomEvent{7.5, 12, Phase::Backward, 256, 8388608, "CUDA out of memory", true, 128, 512,
                              "oom-snapshot-rank0-01.pickle"});
    events.push_back(OomEvent{7.75, 13, Phase::Copy, 64, 0, "", false, 0, 0, ""});
    events.push_back(MemorySample{8.5, 1000000, 2097152, 3000000, 67108864, 60397977});
    events.push_back(StepMetrics{9.5, 14, 2, 14336, 2.302585, 256, 4, 1024, 0.003, 1234.5, 0.83, 41943040, 100});
    {
        MicroBatchDone e{10.5, 14, 2, 512, 256, 1024, 0.25, 2.25, true, {}, 0};
        events.push_back(e);
        e.time = 10.75;
        e.probeTrial = false;
        e.sampleIndices = {5, 3, 9, 0};
        e.gradientNorm = 0.875;
        events.push_back(e);
    }
    events.push_back(OptimizerStepped{11.5, 14, 4});
    events.push_back(TargetBatchChanged{12.5, 1024, 4096, 0.001, 0.004});
    events.push_back(DeviceSwitched{13.5, "virtual:64MiB", "virtual:32MiB", 1});
    events.push_back(Warning{14.5, "the data set's last batch is short"});
    events.push_back(CheckpointSaved{15.5, 20, "runs/a/checkpoint/checkpoint.pt", "", 0});
    events.push_back(CheckpointSaved{15.75, 20, "runs/a/checkpoint/best/checkpoint.pt", "val_accuracy", 0.75});
    events.push_back(ErrorEvent{16.5, "the model does not fit", "step 3, micro-batch 2 (32 samples), forward"});
    events.push_back(RunSummary{17.5,
                                "virtual:64MiB",
                                "cnn",
                                62006,
                                10,
                                "synthetic",
                                50000,
                                {3, 32, 32},
                                "adam, learning rate 0.003",
                                "cross-entropy",
                                1024,
                                true});
    {
        MemoryBreakdown e;
        e.time = 18.5;
        e.step = 14;
        e.device = "virtual:64MiB/caching";
        e.totalBytes = 67108864;
        e.capacityBytes = 66000000;
        e.usableBytes = 59400000;
        e.parameterBytes = 248024;
        e.gradientBytes = 248025;
        e.optimizerStateBytes = 496048;
        e.optimizerStateReserved = true;
        e.activationBytes = 30000000;
        e.activationMicroBatch = 256;
        e.inputBytes = 3145728;
        e.bufferCopyBytes = 1024;
        e.largestGradientBytes = 73728;
        e.residentBytes = 1000000;
        e.peakBytes = 35000000;
        e.cacheBytes = 2097152;
        e.otherProcessBytes = 512;
        e.contextBytes = 300000000;
        e.workspaceBytes = 8519680;
        e.freeBytes = 12345;
        e.memorySavers = "checkpoint";
        events.push_back(e);
        e.time = 18.75;
        e.memorySavers = "";
        events.push_back(e);
    }
    events.push_back(StepModeWaiting{19.5, 15, 1, 256, 256, 1024, true});
    {
        EquivalenceChecked e;
        e.time = 20.5;
        e.step = 15;
        e.samples = 1024;
        e.microBatchSizes = {256, 256, 256, 256};
        e.tensors = {TensorDifference{"conv1.weight", 864, 1.5e-8, 2.5e-7, 0.9999999},
                     TensorDifference{"fc.bias", 10, 0, 0, 1}};
        e.overall = TensorDifference{"all parameters", 62006, 3e-8, 4.5e-7, 0.99999995};
        e.batchStatistics = true;
        e.runningStatisticsRelativeDifference = 2.5e-7;
        e.fullPassOutsideBudget = true;
        e.bfloat16 = true;
        e.float16 = false;
        e.explanation = "equal up to float32 rounding";
        e.seconds = 0.75;
        events.push_back(e);
        e.time = 20.75;
        e.rankMicroBatchSizes = {{256, 256}, {512}};
        e.rankDevices = {"virtual:48MiB", "virtual:192MiB"};
        e.runningStatisticsRelativeDifference = -1;
        e.error = "the full pass did not fit";
        e.float16 = true;
        events.push_back(e);
    }
    {
        ValidationDone e{21.5, 16, 1, 16384, 5000, 1.75, 0.625, 0.875, -1, -1, 500, 1, 2.5};
        events.push_back(e);
        e = ValidationDone{21.75, 16, 1, 16384, 5000, 0.5, -1, -1, 0.25, 0.375, 500, 0, 2.5};
        events.push_back(e);
    }
    {
        RanksStepped e;
        e.time = 22.5;
        e.step = 16;
        e.ranks = {RankStep{0, "virtual:48MiB", 256, 128, 2, 0.5, 512, 0.125, 40000000, 1, true},
                   RankStep{1, "virtual:192MiB", 768, 768, 1, 0.625, 1228.8, 0, 150000000, 0, false}};
        e.allReduceSeconds = 0.015625;
        e.collectives = "Gloo";
        e.collectivesWhy = "the ranks are not all on GPUs of their own";
        e.imbalance = 1.25;
        e.nextShares = {320, 704};
        e.shareReason = "rank 1 is faster";
        e.parametersChecked = true;
        events.push_back(e);
        e.time = 22.75;
        e.collectivesWhy = "";
        e.nextShares = {};
        e.shareReason = "";
        e.parametersChecked = false;
        events.push_back(e);
    }
    {
        RankProbed e;
        e.time = 23.5;
        e.rank = 1;
        e.device = "virtual:192MiB";
        e.probes = {ProbeStarted{23.25, 1, ProbeReason::DeviceSwitch, "virtual:192MiB", 768, 190000000, 0}};
        e.trials = {ProbeTrial{23.3, 1, 1, 768, true, true, 150000000, 0, 0.25}};
        e.finished = {ProbeFinished{23.4, 1, 768, 1, 768, 1, 0.25, false, 0, 0}};
        e.ooms = {OomEvent{23.45, 16, Phase::OptimizerStep, 768, 1024, "oom", true, 384, 0, ""}};
        events.push_back(e);
    }
    {
        SaverSurvey e;
        e.time = 24.5;
        e.step = 17;
        e.device = "virtual:64MiB";
        e.reason = "the probe found a small micro-batch";
        e.usableBytes = 59400000;
        e.targetBatch = 1024;
        e.current = "off";
        SaverOption off{"off", "", true, 1.25e6, 40000.5, 48, 22, 58000000, 900.5, 48, 3};
        SaverOption split{"checkpoint", "the model cannot be split", false, 0, 0, 0, 0, 0, 0, 0, 0};
        e.options = {off, split};
        e.suggestion = "bf16";
        e.advice = "bf16 trains 30% faster here";
        e.seconds = 1.5;
        events.push_back(e);
    }
    events.push_back(MemorySaversChanged{25.5, 17, "off", "bf16", "the survey's suggestion", 96});
    events.push_back(LossScaleChanged{26.5, 18, 65536, 32768, true, 1024});
    // A small-pool segment with a cached block, then a large one half cached.
    AllocatorSegments segments;
    segments.time = 27.5;
    segments.step = 18;
    segments.limitBytes = 64 << 20;
    segments.segments = {
        SegmentView{1 << 20, 2 << 20, true, false, {{0, 512, 500, true, true}, {512, (2 << 20) - 512, 0, false, true}}},
        SegmentView{4 << 20,
                    20 << 20,
                    false,
                    false,
                    {{0, 10 << 20, 10000000, true, true}, {10 << 20, 10 << 20, 0, false, true}}}};
    events.push_back(segments);
    // At an OOM, with an expandable segment's unmapped pages.
    AllocatorSegments oom;
    oom.time = 27.75;
    oom.step = 18;
    oom.atOom = true;
    oom.limitBytes = 64 << 20;
    oom.requestedBytes = 30000000;
    oom.segmentBytes = 40 << 20;
    oom.largestFreeBlock = 20 << 20;
    oom.fragmentation = true;
    oom.segments = {SegmentView{64 << 20,
                                40 << 20,
                                false,
                                true,
                                {{0, 20 << 20, 20000000, true, true},
                                 {20 << 20, 20 << 20, 0, false, true},
                                 {40 << 20, 20 << 20, 0, false, false}}}};
    events.push_back(oom);
    return events;
}

}  // namespace batchpilot::test
