#include <QtTest>

#include <atomic>
#include <chrono>
#include <thread>

#include <torch/torch.h>

#include "core/counting_allocator.h"
#include "core/prefetcher.h"

using namespace batchpilot::core;

namespace {

/// Synthetic images that remember which threads loaded them, and take a while to load.
class SlowImages : public Dataset {
public:
    explicit SlowImages(const DataOptions& options) : m_inner(options) {}
    std::string name() const override { return "slow"; }
    int64_t size() const override { return m_inner.size(); }
    std::vector<int64_t> sampleShape() const override { return m_inner.sampleShape(); }
    int64_t classes() const override { return m_inner.classes(); }
    Batch get(const std::vector<int64_t>& indices) const override {
        if (!indices.empty() && indices.front() < 0) throw std::runtime_error("bad index");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        loaderThread = std::this_thread::get_id();
        ++loads;
        return m_inner.get(indices);
    }
    mutable std::atomic<std::thread::id> loaderThread;
    mutable std::atomic<int> loads{0};

private:
    SyntheticImages m_inner;
};

DataOptions small() {
    DataOptions o;
    o.samples = 64;
    o.height = o.width = 8;
    return o;
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
        std::this_thread::sleep_for(std::chrono::milliseconds(150));  // compute of the current micro-batch
        QCOMPARE(CountingAllocator::instance().allocated(), before);  // host memory, not the device's
        const auto started = std::chrono::steady_clock::now();
        Batch batch = prefetcher.take({1, 2, 3});
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        QVERIFY(data->loaderThread.load() != std::this_thread::get_id());
        QCOMPARE(prefetcher.hits(), qint64(1));
        QVERIFY2(waited < 0.04, "the batch should have been ready: loading overlapped the wait");
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
};

QTEST_APPLESS_MAIN(TestPrefetcher)
#include "tst_prefetcher.moc"
