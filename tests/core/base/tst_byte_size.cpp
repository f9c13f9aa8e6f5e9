#include <QtTest>
#include "tests/test_main.h"

#include "core/base/byte_size.h"

namespace tst_byte_size {

using batchpilot::core::parseByteSize;

class TestByteSize : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void parsesUnits_data() {
        QTest::addColumn<QString>("text");
        QTest::addColumn<qint64>("bytes");
        QTest::newRow("MiB") << QStringLiteral("512MiB") << qint64(512) * 1024 * 1024;
        QTest::newRow("GiB") << QStringLiteral("2GiB") << qint64(2) * 1024 * 1024 * 1024;
        QTest::newRow("decimal GB") << QStringLiteral("1.5GB") << qint64(1500000000);
        QTest::newRow("bare M") << QStringLiteral("800M") << qint64(800) * 1024 * 1024;
        QTest::newRow("lower case, space") << QStringLiteral(" 64 mib ") << qint64(64) * 1024 * 1024;
        QTest::newRow("bytes") << QStringLiteral("1048576") << qint64(1048576);
        QTest::newRow("KiB") << QStringLiteral("4KiB") << qint64(4096);
        QTest::newRow("fractional GiB") << QStringLiteral("0.5GiB") << qint64(512) * 1024 * 1024;
    }
    void parsesUnits() {
        QFETCH(QString, text);
        QFETCH(qint64, bytes);
        const auto parsed = parseByteSize(text.toStdString());
        QVERIFY2(parsed.has_value(), parsed ? "" : parsed.error().c_str());
        QCOMPARE(qint64(*parsed), bytes);
    }

    void rejectsBadSizes_data() {
        QTest::addColumn<QString>("text");
        QTest::addColumn<QString>("reason");
        QTest::newRow("letters") << QStringLiteral("abc") << QStringLiteral("does not start with a number");
        QTest::newRow("empty") << QString() << QStringLiteral("empty");
        QTest::newRow("unknown unit") << QStringLiteral("12parsecs") << QStringLiteral("unknown unit");
        QTest::newRow("zero") << QStringLiteral("0MiB") << QStringLiteral("at least one byte");
        QTest::newRow("negative") << QStringLiteral("-5GiB") << QStringLiteral("at least one byte");
    }
    void rejectsBadSizes() {
        QFETCH(QString, text);
        QFETCH(QString, reason);
        const auto parsed = parseByteSize(text.toStdString());
        QVERIFY(!parsed.has_value());
        const QString message = QString::fromStdString(parsed.error());
        QVERIFY2(message.contains(reason), qPrintable(message));
        // The message shows what would be accepted.
        QVERIFY2(message.contains(QStringLiteral("512MiB")), qPrintable(message));
    }

    void formatsForPeople() {
        using batchpilot::core::formatBytes;
        QCOMPARE(QString::fromStdString(formatBytes(12)), QStringLiteral("12 B"));
        QCOMPARE(QString::fromStdString(formatBytes(512LL * 1024 * 1024)), QStringLiteral("512.0 MiB"));
        QCOMPARE(QString::fromStdString(formatBytes(3LL * 1024 * 1024 * 1024 / 2)), QStringLiteral("1.50 GiB"));
        QCOMPARE(QString::fromStdString(formatBytes(1023LL << 30)), QStringLiteral("1023.00 GiB"));
        QCOMPARE(QString::fromStdString(formatBytes(3LL << 39)), QStringLiteral("1.50 TiB"));
        // What it prints parses back as a size.
        QCOMPARE(*batchpilot::core::parseByteSize(formatBytes(3LL << 39)), 3LL << 39);
    }
};

}  // namespace tst_byte_size

BATCHPILOT_TEST_MAIN(tst_byte_size::TestByteSize)
#include "tst_byte_size.moc"
