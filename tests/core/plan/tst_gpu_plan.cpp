#include <QtTest>
#include "tests/test_main.h"

#include <string>
#include <vector>

#include "core/plan/gpu_plan.h"

namespace tst_gpu_plan {

using namespace batchpilot::core;

constexpr int64_t MiB = 1024 * 1024;

// The plan for every GPU from one memory line, each figure worked out by hand: a preset's usable
// memory is (its capacity − the CUDA context and libraries: 287 MB + 238 MiB before Hopper) ×
// (1 − headroom); the fixed part moves from
// the probe device's cuBLAS workspace to the preset's (8,519,680 B, or 32 MiB from H100 on).
class TestGpuPlan : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void eachGpuGetsItsOwnMicroBatch() {
        const auto targets = gpuPlanTargets("T4,virtual:H200");
        QVERIFY2(targets.has_value(), targets ? "" : targets.error().c_str());
        // 100 MiB fixed (measured on virtual:<size>, no workspace), 40 MiB per sample, target 512.
        const auto rows = planForGpus(*targets, 100.0 * MiB, 40.0 * MiB, 0, 512, 0.05);
        QCOMPARE(rows.size(), size_t{2});
        // T4: (15094 MiB − 287,000,000 − 249,561,088) × 0.95 = 14,526,112,803 B usable; fixed
        // 104,857,600 + 8,519,680; (14,526,112,803 − 113,377,280) / 41,943,040 = 343.6 → 343, so
        // 512 = 2 × 256.
        QCOMPARE(rows[0].target.device, std::string("virtual:T4"));
        QCOMPARE(rows[0].usableBytes, int64_t{14526112803});
        QCOMPARE(rows[0].microBatch, int64_t{343});
        QCOMPARE(rows[0].plan, std::string("2 × 256"));
        // H200: 3390 samples fit; the target batch is one micro-batch.
        QCOMPARE(rows[1].microBatch, int64_t{512});
        QCOMPARE(rows[1].plan, std::string("1 × 512"));
        const std::string table = formatGpuPlan(rows, "virtual:2GiB", 512);
        QVERIFY2(table.find("virtual:T4") != std::string::npos && table.find("2 × 256") != std::string::npos,
                 table.c_str());
    }

    void aModelTooLargeForAGpuSaysWhatOneSampleNeeds() {
        const auto rows = planForGpus(*gpuPlanTargets("T4"), 16.0 * 1024 * MiB, 40.0 * MiB, 0, 512, 0.05);
        QCOMPARE(rows[0].microBatch, int64_t{0});
        QVERIFY(rows[0].plan.empty());
        QCOMPARE(rows[0].neededBytes, int64_t{17230331904});  // 16 GiB + the workspace + one sample
        QVERIFY(formatGpuPlan(rows, "virtual:H200", 512).find("does not fit") != std::string::npos);
    }

    void theProbeDevicesWorkspaceIsNotCountedTwice() {
        // Measured on an H100 preset (32 MiB workspace in its fixed part), carried to another H100.
        const auto same = planForGpus(*gpuPlanTargets("H100-80GB"), 132.0 * MiB, 40.0 * MiB, 32 * MiB, 100000, 0.05);
        const auto fresh = planForGpus(*gpuPlanTargets("H100-80GB"), 100.0 * MiB, 40.0 * MiB, 0, 100000, 0.05);
        QCOMPARE(same[0].microBatch, fresh[0].microBatch);
    }

    void namesAreCheckedAndAllMeansEveryPreset() {
        QCOMPARE(gpuPlanTargets("all")->size(), size_t{7});
        const auto bad = gpuPlanTargets("T4,V100");
        QVERIFY(!bad.has_value());
        QVERIFY2(
            bad.error().find("\"V100\"") != std::string::npos && bad.error().find("A100-80GB") != std::string::npos,
            bad.error().c_str());
        QVERIFY(!gpuPlanTargets(",").has_value());
    }
};

}  // namespace tst_gpu_plan

BATCHPILOT_TEST_MAIN(tst_gpu_plan::TestGpuPlan)
#include "tst_gpu_plan.moc"
