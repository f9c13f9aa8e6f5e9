#include <QtTest>

#include <new>
#include <stdexcept>

#include <torch/torch.h>

#include "core/oom.h"

using namespace batchpilot::core;

namespace {

template <typename E>
FailureInfo classify(E error) {
    return classifyFailure(std::make_exception_ptr(std::move(error)));
}

c10::Error c10Error(const std::string& message) { return c10::Error(message, ""); }

}  // namespace

class TestOomClassification : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void outOfMemoryErrorType() {
        const auto info = classify(c10::OutOfMemoryError(c10::SourceLocation{"f", "file", 1}, "anything"));
        QVERIFY(info.outOfMemory);
    }

    void knownAllocatorMessages_data() {
        QTest::addColumn<QString>("message");
        QTest::addColumn<qint64>("requested");
        QTest::newRow("cuda") << QStringLiteral("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total)")
                              << qint64(20) * 1024 * 1024;
        QTest::newRow("cpu") << QStringLiteral("[enforce fail at alloc_cpu.cpp:75] . DefaultCPUAllocator: can't allocate memory: you tried to allocate 123456 bytes. Error code 12")
                             << qint64(123456);
        QTest::newRow("cublas") << QStringLiteral("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)") << qint64(0);
        QTest::newRow("hip") << QStringLiteral("HIP out of memory. Tried to allocate 2.00 GiB") << qint64(2) * 1024 * 1024 * 1024;
    }
    void knownAllocatorMessages() {
        QFETCH(QString, message);
        QFETCH(qint64, requested);
        const auto info = classify(c10Error(message.toStdString()));
        QVERIFY(info.outOfMemory);
        QCOMPARE(info.requestedBytes, requested);
    }

    void badAlloc() { QVERIFY(classify(std::bad_alloc()).outOfMemory); }

    void realErrorsAreNotOom_data() {
        QTest::addColumn<QString>("message");
        QTest::newRow("shape") << QStringLiteral("mat1 and mat2 shapes cannot be multiplied (4x10 and 12x3)");
        QTest::newRow("cudnn not supported") << QStringLiteral("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED");
        QTest::newRow("illegal memory access") << QStringLiteral("CUDA error: an illegal memory access was encountered");
    }
    void realErrorsAreNotOom() {
        QFETCH(QString, message);
        const auto info = classify(c10Error(message.toStdString()));
        QVERIFY(!info.outOfMemory);
        QVERIFY(QString::fromStdString(info.message).contains(message.left(20)));
    }

    void realShapeErrorFromTorch() {
        std::exception_ptr error;
        try {
            torch::matmul(torch::ones({4, 10}), torch::ones({12, 3}));
        } catch (const std::exception&) {
            error = std::current_exception();
        }
        QVERIFY(error);
        const auto info = classifyFailure(error);
        QVERIFY(!info.outOfMemory);
        QVERIFY(!info.message.empty());
    }

    void otherExceptionsAreNotOom() {
        QVERIFY(!classify(std::runtime_error("loss is nan")).outOfMemory);
        QVERIFY(!classify(std::invalid_argument("bad")).outOfMemory);
    }
};

QTEST_APPLESS_MAIN(TestOomClassification)
#include "tst_oom_classification.moc"
