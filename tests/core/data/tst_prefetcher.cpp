#include <QtTest>
#include "tests/test_main.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "core/device/counting_allocator.h"
#include "core/device/math_libraries.h"
#include "core/data/prefetcher.h"
#include "core/train/trainer.h"
#include "tests/core/recording_sink.h"

namespace tst_prefetcher {

using namespace batchpilot::core;

namespace {

/// Synthetic images that remember every load (its indices and thread) and can be waited on, to
/// order the threads without sleeping.
class SlowImages : public Dataset {
public:
    explicit SlowImages(const DataOptions& options) : m_inner(options) {}
    std::string name() const override { return "slow"; }
    int64_t size() const override { return m_inner.size(); }
    std::vector<int64_t> sampleShape() const override { return m_inner.sampleShape(); }
    int64_t classes() const override { return m_inner.classes(); }
    Batch get(const std::vector<int64_t>& indices) const override {
        if (!indices.empty() && indices.front() < 0) throw std::runtime_error("bad index");
        loaderThread = std::this_thread::get_id();
        Batch batch = m_inner.get(indices);
        {
            std::lock_guard lock(m_mutex);
            ++loads;
            history.push_back({std::this_thread::get_id(), indices});
        }
        m_loaded.notify_all();
        return batch;
    }
    /// Waits (at most 30 s) until `count` loads have finished.
    bool waitForLoads(int count) const {
        std::unique_lock lock(m_mutex);
        return m_loaded.wait_for(lock, std::chrono::seconds(30), [&] { return loads >= count; });
    }
    int loadCount() const {
        std::lock_guard lock(m_mutex);
        return loads;
    }
    struct Load {
        std::thread::id thread;
        std::vector<int64_t> indices;
    };
    mutable std::atomic<std::thread::id> loaderThread;
    mutable int loads = 0;              ///< guarded by m_mutex
    mutable std::vector<Load> history;  ///< guarded by m_mutex; read after the loads

private:
    SyntheticImages m_inner;
    mutable std::mutex m_mutex;
    mutable std::condition_variable m_loaded;
};

DataOptions small() {
    DataOptions o;
    o.samples = 64;
    o.height = o.width = 8;
    return o;
}

/// small() with enough samples for a few training batches of 64.
DataOptions trainingData() {
    DataOptions o = small();
    o.samples = 256;
    return o;
}

/// A run of the built-in MLP on `images` at exactly micro-batch 16 (no faster size searched),
/// target batch 64, on this thread.
TrainerOptions trainOn(const std::shared_ptr<SlowImages>& images) {
    TrainerOptions options;
    options.model.name = "mlp";
    options.data = trainingData();
    const std::shared_ptr<Dataset> dataset = images;
    options.datasetFactory = [dataset]() -> tl::expected<std::shared_ptr<Dataset>, std::string> { return dataset; };
    options.targetBatch = 64;
    options.probe.initialMicroBatch = 16;
    options.probe.maxMicroBatch = 16;
    options.probe.objective = ProbeObjective::Largest;
    return options;
}

}  // namespace

class TestPrefetcher : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase() { installCountingAllocator(); }

    void loadsInBackgroundUncounted() {
        auto data = std::make_shared<SlowImages>(small());
        Prefetcher prefetcher(data);
        CountingScope counting;  // as on the trainer thread
        const int64_t before = CountingAllocator::instance().allocated();
        prefetcher.request({1, 2, 3});
        // The load finishes on the loader thread while this thread does other work (here: waits).
        QVERIFY2(data->waitForLoads(1), "the requested batch was never loaded in the background");
        QCOMPARE(CountingAllocator::instance().allocated(), before);  // host memory, not the device's
        Batch batch = prefetcher.take({1, 2, 3});
        QVERIFY(data->loaderThread.load() != std::this_thread::get_id());
        QCOMPARE(prefetcher.hits(), qint64(1));
        // Served from the background load: take() did not load it again.
        QCOMPARE(data->loadCount(), 1);
        QVERIFY(torch::equal(batch.inputs, SyntheticImages(small()).get({1, 2, 3}).inputs));
    }

    void otherIndicesLoadNow() {
        auto data = std::make_shared<SlowImages>(small());
        Prefetcher prefetcher(data);
        prefetcher.request({4, 5});
        Batch batch = prefetcher.take({6, 7});
        QCOMPARE(prefetcher.hits(), qint64(0));
        QVERIFY(torch::equal(batch.targets, SyntheticImages(small()).get({6, 7}).targets));
        // The stale request is not served for other indices later either.
        Batch again = prefetcher.take({4, 6});
        QVERIFY(torch::equal(again.targets, SyntheticImages(small()).get({4, 6}).targets));
    }

    void backgroundErrorsReachTheCaller() {
        auto data = std::make_shared<SlowImages>(small());
        Prefetcher prefetcher(data);
        prefetcher.request({-1});
        QVERIFY_THROWS_EXCEPTION(std::runtime_error, prefetcher.take({-1}));
    }

    /// In training, every micro-batch after a step's first is loaded once, ahead, on the
    /// prefetch thread: requesting the next one must not throw away the one being loaded for now
    /// (it did: each micro-batch was loaded twice, once for nothing, and the trainer waited).
    void trainerLoadsEachMicroBatchOnceAhead() {
        auto images = std::make_shared<SlowImages>(trainingData());
        TrainerOptions options = trainOn(images);
        options.steps = 4;
        options.intraOpThreads = 1;
        options.prefetch = Prefetch::Thread;  // whatever CPUs this machine has
        batchpilot::tests::RecordingSink sink;
        Trainer trainer(options, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Finished);
        QCOMPARE(result.microBatch, int64_t{16});
        std::map<std::vector<int64_t>, int> timesLoaded;
        int ahead = 0;
        for (const auto& load : images->history) {
            ++timesLoaded[load.indices];
            if (load.thread != std::this_thread::get_id()) ++ahead;
        }
        for (const auto& [indices, times] : timesLoaded) QCOMPARE(times, 1);
        // 4 steps of 4 micro-batches: 16 loads; all but each step's first (and the probe's
        // single trial) are made ahead on the prefetch thread.
        QCOMPARE(static_cast<int>(images->history.size()), 16);
        QVERIFY2(ahead >= 11, qPrintable(QString::number(ahead) + QStringLiteral(" of 16 loads were made ahead")));
    }

    /// Auto loads ahead only where a CPU is free for the prefetch thread, or the GPU computes.
    void autoLoadsAheadWhereACpuIsFree() {
        QVERIFY(loadsAhead(Prefetch::Auto, DeviceKind::Cpu, 1, 0, 2));
        QVERIFY(!loadsAhead(Prefetch::Auto, DeviceKind::Cpu, 2, 0, 2));      // the CLI's default on 2 CPUs
        QVERIFY(!loadsAhead(Prefetch::Auto, DeviceKind::Virtual, 3, 1, 4));  // the app: one CPU for the window
        QVERIFY(!loadsAhead(Prefetch::Auto, DeviceKind::Cpu, 1, 1, 2));      // 2 ranks on 2 CPUs, 1 thread each
        QVERIFY(loadsAhead(Prefetch::Auto, DeviceKind::Virtual, 2, 1, 4));
        QVERIFY(loadsAhead(Prefetch::Auto, DeviceKind::Cuda, 8, 0, 8));  // the GPU computes, the CPUs wait
        QVERIFY(loadsAhead(Prefetch::Thread, DeviceKind::Cpu, 2, 0, 2));
        QVERIFY(!loadsAhead(Prefetch::Inline, DeviceKind::Cuda, 1, 0, 8));
    }

    /// Where the intra-op threads take every CPU, a run left to Auto loads every micro-batch on
    /// the trainer thread, once.
    void autoLoadsInLineWhenTheThreadsTakeEveryCpu() {
        auto images = std::make_shared<SlowImages>(trainingData());
        TrainerOptions options = trainOn(images);
        options.steps = 2;
        options.intraOpThreads = cpusAvailable();
        batchpilot::tests::RecordingSink sink;
        Trainer trainer(options, sink);
        const RunResult result = trainer.run();
        QCOMPARE(result.state, RunState::Finished);
        std::map<std::vector<int64_t>, int> timesLoaded;
        for (const auto& load : images->history) {
            ++timesLoaded[load.indices];
            QVERIFY(load.thread == std::this_thread::get_id());  // the trainer runs on this thread
        }
        QCOMPARE(static_cast<int>(images->history.size()), 8);
        for (const auto& [indices, times] : timesLoaded) QCOMPARE(times, 1);
    }
};

}  // namespace tst_prefetcher

BATCHPILOT_TEST_MAIN(tst_prefetcher::TestPrefetcher)
#include "tst_prefetcher.moc"
