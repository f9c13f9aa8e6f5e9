#include <QtTest>
#include "tests/test_main.h"

#include <new>
#include <stdexcept>

#include <torch/script.h>
#include <torch/torch.h>

#include "core/device/counting_allocator.h"
#include "core/device/oom.h"

namespace tst_oom_classification {

using namespace batchpilot::core;

namespace {

template <typename E>
FailureInfo classify(E error) {
    return classifyFailure(std::make_exception_ptr(std::move(error)));
}

c10::Error c10Error(const std::string& message) {
    return c10::Error(c10::SourceLocation{"f", "file", 1}, message);
}

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
        QTest::newRow("cuda") << QStringLiteral(
                                     "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total)")
                              << qint64(20) * 1024 * 1024;
        QTest::newRow("cpu") << QStringLiteral(
                                    "[enforce fail at alloc_cpu.cpp:75] . DefaultCPUAllocator: can't allocate memory: "
                                    "you tried to allocate 123456 bytes. Error code 12")
                             << qint64(123456);
        QTest::newRow("cublas") << QStringLiteral(
                                       "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)")
                                << qint64(0);
        QTest::newRow("hip") << QStringLiteral("HIP out of memory. Tried to allocate 2.00 GiB")
                             << qint64(2) * 1024 * 1024 * 1024;
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
        QTest::newRow("illegal memory access")
            << QStringLiteral("CUDA error: an illegal memory access was encountered");
    }
    void realErrorsAreNotOom() {
        QFETCH(QString, message);
        const auto info = classify(c10Error(message.toStdString()));
        QVERIFY(!info.outOfMemory);
        QVERIFY(QString::fromStdString(info.message).contains(message.left(20)));
        // cuDNN's NOT_SUPPORTED may be memory (a workspace too large): the trainer decides by size.
        QCOMPARE(info.maybeOutOfMemory, message.contains(QStringLiteral("NOT_SUPPORTED")));
    }

    /// oneDNN under memory pressure (PyPI's LibTorch) says "could not create a primitive", not
    /// that memory ran out: not an OOM by itself, but marked as possibly one (the trainer then
    /// tries a smaller micro-batch, tst_trainer_errors).
    void libraryFailuresThatMayBeMemory() {
        const auto info =
            classify(c10Error("could not create a primitive descriptor for a convolution forward "
                              "propagation primitive"));
        QVERIFY(!info.outOfMemory);
        QVERIFY(info.maybeOutOfMemory);
        const auto plain = classify(c10Error("mat1 and mat2 shapes cannot be multiplied (4x10 and 12x3)"));
        QVERIFY(!plain.maybeOutOfMemory);
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

    /// An OOM raised inside a TorchScript model reaches C++ wrapped by the interpreter (a plain
    /// std::runtime_error on LibTorch 1.13 whose first line is "The following operation failed in
    /// the TorchScript interpreter."): it is still an OOM, and the message is the original error.
    void oomInsideTorchScriptIsOom() {
        installCountingAllocator();
        auto& allocator = CountingAllocator::instance();
        torch::jit::Module module("Net");
        module.define(R"(
def forward(self, x):
    y = torch.ones([4194304]) * x.sum()
    return y.sum()
)");
        std::exception_ptr error;
        {
            CountingScope counting;
            allocator.setBudget(int64_t{8} << 20);
            try {
                module.forward({torch::ones({2})});
            } catch (const std::exception&) {
                error = std::current_exception();
            }
            allocator.setBudget(0);
        }
        QVERIFY2(error, "the 16 MiB tensor must not fit an 8 MiB budget");
        const auto info = classifyFailure(error);
        QVERIFY(info.outOfMemory);
        QVERIFY(info.insideTorchScript);
        QVERIFY2(QString::fromStdString(info.message).startsWith(QStringLiteral("virtual GPU out of memory")),
                 info.message.c_str());
        QCOMPARE(info.requestedBytes, qint64(4194304) * 4);
        QVERIFY(info.detail.find("TorchScript interpreter") != std::string::npos);
    }

    /// A real error inside a script is not an OOM, even when the script's source (which the
    /// traceback quotes) mentions one; the message is the inner reason.
    void realErrorInsideTorchScriptIsNotOom() {
        torch::jit::Module module("Net");
        module.define(R"(
def forward(self, x):
    return torch.matmul(x, torch.ones([3, 3])) if len("CUDA out of memory") > 0 else x
)");
        std::exception_ptr error;
        try {
            module.forward({torch::ones({2, 4})});
        } catch (const std::exception&) {
            error = std::current_exception();
        }
        QVERIFY(error);
        const auto info = classifyFailure(error);
        QVERIFY(!info.outOfMemory);
        QVERIFY(info.insideTorchScript);
        QVERIFY2(info.message.find("mat1 and mat2 shapes cannot be multiplied") != std::string::npos,
                 info.message.c_str());
        QVERIFY2(info.message.find("TorchScript interpreter") == std::string::npos, info.message.c_str());
    }

    /// The interpreter's text, as LibTorch 1.13 and 2.x write it, with another Python class.
    void interpreterTextParsing_data() {
        QTest::addColumn<QString>("text");
        QTest::addColumn<bool>("oom");
        QTest::addColumn<QString>("reason");
        const QString head = QStringLiteral(
            "The following operation failed in the TorchScript interpreter.\n"
            "Traceback of TorchScript (most recent call last):\n"
            "  File \"code/__torch__.py\", line 8, in forward\n"
            "    _0 = torch.conv2d(x, w)\n"
            "         ~~~~~~~~~~~~ <--- HERE\n");
        QTest::newRow("cpu 1.13") << head + QStringLiteral(
                                                "RuntimeError: [enforce fail at alloc_cpu.cpp:75] err == 0. "
                                                "DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                                "134217728 bytes. Error code 12\n")
                                  << true << QStringLiteral("[enforce fail at alloc_cpu.cpp:75]");
        QTest::newRow("cuda 2.x class")
            << head + QStringLiteral("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0\n")
            << true << QStringLiteral("torch.OutOfMemoryError: CUDA out of memory");
        QTest::newRow("value error")
            << head + QStringLiteral("builtins.ValueError: Expected more than 1 value per channel when training\n")
            << false << QStringLiteral("builtins.ValueError: Expected more than 1 value");
    }
    void interpreterTextParsing() {
        QFETCH(QString, text);
        QFETCH(bool, oom);
        QFETCH(QString, reason);
        const auto info = classify(std::runtime_error(text.toStdString()));
        QCOMPARE(info.outOfMemory, oom);
        QVERIFY2(QString::fromStdString(info.message).startsWith(reason), info.message.c_str());
    }

    /// std::throw_with_nested: the cause is looked at too, and named in the message.
    void nestedOomIsOom() {
        std::exception_ptr error;
        try {
            try {
                throw c10::OutOfMemoryError(c10::SourceLocation{"f", "file", 1},
                                            "CUDA out of memory. Tried to allocate 2.00 MiB");
            } catch (...) {
                std::throw_with_nested(std::runtime_error("loading the micro-batch failed"));
            }
        } catch (const std::exception&) {
            error = std::current_exception();
        }
        const auto info = classifyFailure(error);
        QVERIFY(info.outOfMemory);
        QCOMPARE(info.requestedBytes, qint64(2) * 1024 * 1024);
        QVERIFY2(info.message.find("loading the micro-batch failed: CUDA out of memory") != std::string::npos,
                 info.message.c_str());
    }

    void otherExceptionsAreNotOom() {
        QVERIFY(!classify(std::runtime_error("loss is nan")).outOfMemory);
        QVERIFY(!classify(std::invalid_argument("bad")).outOfMemory);
    }
};

}  // namespace tst_oom_classification

BATCHPILOT_TEST_MAIN(tst_oom_classification::TestOomClassification)
#include "tst_oom_classification.moc"
