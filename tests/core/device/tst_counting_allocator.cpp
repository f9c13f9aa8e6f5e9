#include <QtTest>
#include "tests/test_main.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include <torch/torch.h>

#include "core/device/counting_allocator.h"
#include "core/device/device.h"

namespace tst_counting_allocator {

using namespace batchpilot::core;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerMalloc = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizerMalloc = true;
#else
constexpr bool kSanitizerMalloc = false;
#endif
#else
constexpr bool kSanitizerMalloc = false;
#endif

/// Page faults this process took while `touch` ran (the kernel's count: getrusage's ru_minflt).
template <typename F>
long minorFaultsDuring(F&& touch) {
    rusage before{};
    rusage after{};
    getrusage(RUSAGE_SELF, &before);
    touch();
    getrusage(RUSAGE_SELF, &after);
    return after.ru_minflt - before.ru_minflt;
}

class TestCountingAllocator : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase() { installCountingAllocator(); }
    void cleanup() {
        CountingAllocator::instance().setBudget(0);
        CountingAllocator::instance().failAfter(0);
    }

    void countsOnlyCountingThreads() {
        auto& allocator = CountingAllocator::instance();
        const int64_t before = allocator.allocated();
        torch::Tensor uncounted = torch::empty({1024}, torch::kFloat32);
        QCOMPARE(allocator.allocated(), before);
        {
            CountingScope counting;
            torch::Tensor counted = torch::empty({1024}, torch::kFloat32);
            QCOMPARE(allocator.allocated(), before + 4096);
            // Another thread's allocations do not count, even while this one counts.
            std::thread other([] { torch::Tensor t = torch::empty({4096}, torch::kFloat32); });
            other.join();
            QCOMPARE(allocator.allocated(), before + 4096);
        }
        QCOMPARE(allocator.allocated(), before);
    }

    void freeOnAnotherThreadUncounts() {
        auto& allocator = CountingAllocator::instance();
        const int64_t before = allocator.allocated();
        torch::Tensor t;
        {
            CountingScope counting;
            t = torch::empty({256}, torch::kFloat64);
        }
        QCOMPARE(allocator.allocated(), before + 2048);
        std::thread other([moved = std::move(t)]() mutable { moved = torch::Tensor(); });
        other.join();
        QCOMPARE(allocator.allocated(), before);
    }

    void budgetThrowsOutOfMemoryError() {
        auto& allocator = CountingAllocator::instance();
        CountingScope counting;
        const int64_t before = allocator.allocated();
        allocator.setBudget(before + 1024 * 1024);
        torch::Tensor fits = torch::empty({128 * 1024}, torch::kFloat32);  // 512 KiB
        try {
            torch::Tensor tooMuch = torch::empty({256 * 1024}, torch::kFloat32);  // 1 MiB more
            QFAIL("allocation past the budget did not throw");
        } catch (const c10::OutOfMemoryError& e) {
            QVERIFY(QString::fromUtf8(e.what()).contains(QStringLiteral("tried to allocate 1.0 MiB")));
        }
        QCOMPARE(allocator.lastFailedRequest(), qint64(1024 * 1024));
        // The failed allocation left nothing behind.
        QCOMPARE(allocator.allocated(), before + 512 * 1024);
        fits = torch::Tensor();
        QCOMPARE(allocator.allocated(), before);
    }

    void peakIsResettable() {
        auto& allocator = CountingAllocator::instance();
        CountingScope counting;
        allocator.resetPeak();
        const int64_t base = allocator.allocated();
        { torch::Tensor big = torch::empty({1 << 20}, torch::kUInt8); }
        QCOMPARE(allocator.peak(), base + (1 << 20));
        allocator.resetPeak();
        QCOMPARE(allocator.peak(), base);
    }

    void injectsFailureAtNthAllocation() {
        auto& allocator = CountingAllocator::instance();
        CountingScope counting;
        allocator.failAfter(3);
        torch::Tensor a = torch::empty({4});
        torch::Tensor b = torch::empty({4});
        QVERIFY_THROWS_EXCEPTION(c10::OutOfMemoryError, torch::empty({4}));
        // One-shot: the next allocation succeeds.
        torch::Tensor d = torch::empty({4});
        QVERIFY(d.defined());
    }

    void meterReportsVirtualDevice() {
        const auto device = parseDevice("virtual:64MiB/caching");
        QVERIFY(device.has_value());
        auto meter = openMeter(*device);
        QCOMPARE(meter->capacity(), qint64(64) * 1024 * 1024);
        QCOMPARE(CountingAllocator::instance().budget(), qint64(64) * 1024 * 1024);
        CountingScope counting;
        const int64_t before = meter->allocated();
        const int64_t reservedBefore = meter->reserved();
        torch::Tensor t = torch::empty({1 << 20}, torch::kUInt8);
        QCOMPARE(meter->allocated(), before + (1 << 20));
        // PyTorch's caching allocator: a request of 1 MiB is "small", packed into a 2 MiB segment,
        // and the budget counts the segment.
        QCOMPARE(meter->reserved(), reservedBefore + (2 << 20));
        QCOMPARE(meter->free(), meter->capacity() - meter->reserved());
        t = torch::Tensor();
        QCOMPARE(meter->allocated(), before);
        QCOMPARE(meter->reserved(), reservedBefore + (2 << 20));  // cached, not returned
        meter->releaseCache();
        QCOMPARE(meter->reserved(), reservedBefore);
        // Exact counting (asked for by name): every byte, nothing cached.
        auto exact = openMeter(*parseDevice("virtual:64MiB/exact"));
        const int64_t exactBefore = exact->reserved();
        torch::Tensor u = torch::empty({1000}, torch::kUInt8);
        QCOMPARE(exact->allocated(), exactBefore + 1000);
        QCOMPARE(exact->reserved(), exactBefore + 1000);
        auto cpu = openMeter(*parseDevice("cpu"));
        QCOMPARE(CountingAllocator::instance().budget(), qint64(0));
        QVERIFY(cpu->capacity() > 0);
    }

    void parsesDevices_data() {
        QTest::addColumn<QString>("text");
        QTest::addColumn<bool>("valid");
        QTest::addColumn<QString>("canonicalOrMessage");
        QTest::newRow("cpu") << QStringLiteral("cpu") << true << QStringLiteral("cpu");
        QTest::newRow("virtual") << QStringLiteral("virtual:512MiB") << true << QStringLiteral("virtual:512MiB");
        QTest::newRow("virtual GiB") << QStringLiteral("virtual:2GiB") << true << QStringLiteral("virtual:2GiB");
        QTest::newRow("virtual bad size")
            << QStringLiteral("virtual:abc") << false << QStringLiteral("is neither a memory size");
        QTest::newRow("virtual bad number")
            << QStringLiteral("virtual:12xB") << false << QStringLiteral("invalid memory size");
        QTest::newRow("virtual GPU preset")
            << QStringLiteral("virtual:a100-40gb") << true << QStringLiteral("virtual:A100-40GB");
        QTest::newRow("virtual no size") << QStringLiteral("virtual") << false
                                         << QStringLiteral("needs a memory budget");
        QTest::newRow("unknown") << QStringLiteral("tpu:0") << false
                                 << QStringLiteral("use cpu, cuda:N or virtual:<size>");
        QTest::newRow("cuda index") << QStringLiteral("cuda:x") << false << QStringLiteral("must be a number");
        QTest::newRow("cuda absent") << QStringLiteral("cuda:99") << false << QStringLiteral("does not exist");
    }
    void parsesDevices() {
        QFETCH(QString, text);
        QFETCH(bool, valid);
        QFETCH(QString, canonicalOrMessage);
        const auto device = parseDevice(text.toStdString());
        QCOMPARE(device.has_value(), valid);
        const QString got = QString::fromStdString(valid ? device->name() : device.error());
        QVERIFY2(valid ? got == canonicalOrMessage : got.contains(canonicalOrMessage), qPrintable(got));
    }

    void listsDevices() {
        const auto devices = availableDevices();
        QVERIFY(!devices.empty());
        QCOMPARE(QString::fromStdString(devices.front().id), QStringLiteral("cpu"));
        QCOMPARE(devices.size() > 1, cudaAvailable());
    }

    void aFreedLargeHostBlockIsReusedNotFaultedInAgain() {
        // installCountingAllocator() keeps freed host memory (mallopt): a block far above glibc's
        // own mmap threshold (at most 32 MiB), freed and asked for again, comes back from the heap
        // already mapped. With glibc's rules it was unmapped on free and mapped afresh, every page
        // faulted in again: what made a 224x224 ResNet's micro-batches spend half their time in
        // the kernel. The reference is the kernel's own count of page faults.
        if (kSanitizerMalloc) QSKIP("the sanitizer's allocator replaces glibc's malloc: its settings do not apply");
        if (const char* tunables = std::getenv("GLIBC_TUNABLES");
            tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr)
            QSKIP("GLIBC_TUNABLES sets glibc's malloc: BatchPilot leaves it as given");
        constexpr size_t kBytes = size_t{100} << 20;
        constexpr long kPages = static_cast<long>(kBytes / 4096);
        volatile unsigned char sink = 0;
        const auto touchOnce = [&] {
            auto* block = static_cast<unsigned char*>(std::malloc(kBytes));
            if (block == nullptr) return -1L;
            const long faults = minorFaultsDuring([&] { std::memset(block, 1, kBytes); });
            sink = sink + block[kBytes / 2];
            std::free(block);
            return faults;
        };
        const long first = touchOnce();
        const long again = touchOnce();
        QVERIFY2(first >= 0 && again >= 0, "no 100 MiB of host memory");
        qInfo("100 MiB touched: %ld page faults the first time, %ld the second", first, again);
        QVERIFY2(again < kPages / 10,
                 qPrintable(QStringLiteral("%1 page faults touching a 100 MiB block again (%2 pages): it was mapped "
                                           "afresh, not kept")
                                .arg(again)
                                .arg(kPages)));
        // The same on a thread of its own, as the window trains (its trainer thread): a thread that
        // has allocated something gets an arena of its own from glibc, at most 64 MiB, where a
        // larger block is mapped afresh whatever the threshold (25,600 faults again, measured)
        // unless every thread shares the main arena.
        long threadFirst = -1;
        long threadAgain = -1;
        std::thread trainer([&] {
            void* small = std::malloc(64);  // the thread's first allocation: its own arena
            sink = sink + (small != nullptr ? 1 : 0);
            threadFirst = touchOnce();
            threadAgain = touchOnce();
            std::free(small);
        });
        trainer.join();
        QVERIFY2(threadFirst >= 0 && threadAgain >= 0, "no 100 MiB of host memory on a thread");
        qInfo("100 MiB touched on another thread: %ld page faults the first time, %ld the second", threadFirst,
              threadAgain);
        QVERIFY2(threadAgain < kPages / 10,
                 qPrintable(QStringLiteral("%1 page faults touching a 100 MiB block again on a thread of its own "
                                           "(%2 pages): it was mapped afresh, not kept")
                                .arg(threadAgain)
                                .arg(kPages)));
    }
};

}  // namespace tst_counting_allocator

BATCHPILOT_TEST_MAIN(tst_counting_allocator::TestCountingAllocator)
#include "tst_counting_allocator.moc"
