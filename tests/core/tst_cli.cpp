#include <QtTest>

#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QRegularExpression>
#include <QTemporaryDir>

#include <csignal>
#include <sys/types.h>

namespace {

struct Run {
    int exitCode;
    QString out;
    QString err;
};

Run runCli(const QStringList& args) {
    QProcess process;
    process.start(QStringLiteral(BATCHPILOT_CLI_PATH), args);
    if (!process.waitForFinished(120000)) {
        process.kill();
        return {-1, {}, QStringLiteral("timed out")};
    }
    return {process.exitStatus() == QProcess::NormalExit ? process.exitCode() : -2,
            QString::fromUtf8(process.readAllStandardOutput()), QString::fromUtf8(process.readAllStandardError())};
}

}  // namespace

class TestCli : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void badInputIsOneClearLine_data() {
        QTest::addColumn<QStringList>("args");
        QTest::addColumn<int>("exitCode");
        QTest::addColumn<QString>("message");
        QTest::newRow("unknown model") << QStringList{QStringLiteral("--model"), QStringLiteral("gpt5")} << 2
                                       << QStringLiteral("unknown model \"gpt5\": choose mlp, cnn or resnet");
        QTest::newRow("target 0") << QStringList{QStringLiteral("--target-batch"), QStringLiteral("0")} << 2
                                  << QStringLiteral("--target-batch must be at least 1, got 0");
        QTest::newRow("target negative") << QStringList{QStringLiteral("--target-batch=-5")} << 2
                                         << QStringLiteral("--target-batch must be at least 1");
        QTest::newRow("target not integer") << QStringList{QStringLiteral("--target-batch"), QStringLiteral("12.5")} << 2
                                            << QStringLiteral("--target-batch expects a whole number, got \"12.5\"");
        QTest::newRow("no such device") << QStringList{QStringLiteral("--device"), QStringLiteral("cuda:99")} << 2
                                        << QStringLiteral("\"cuda:99\" does not exist");
        QTest::newRow("bad budget") << QStringList{QStringLiteral("--device"), QStringLiteral("virtual:abc")} << 2
                                    << QStringLiteral("invalid memory size \"abc\"");
        QTest::newRow("unknown flag") << QStringList{QStringLiteral("--turbo")} << 2 << QStringLiteral("unknown flag \"--turbo\"");
        QTest::newRow("missing value") << QStringList{QStringLiteral("--steps")} << 2 << QStringLiteral("--steps needs a value");
        QTest::newRow("budget too small") << QStringList{QStringLiteral("--model"), QStringLiteral("resnet"), QStringLiteral("--device"),
                                                         QStringLiteral("virtual:1MiB"), QStringLiteral("--steps"), QStringLiteral("1")}
                                          << 1 << QStringLiteral("fit on virtual:1MiB: needs ≈");
    }
    void badInputIsOneClearLine() {
        QFETCH(QStringList, args);
        QFETCH(int, exitCode);
        QFETCH(QString, message);
        const Run run = runCli(args);
        QCOMPARE(run.exitCode, exitCode);
        QVERIFY2(run.err.contains(message), qPrintable(run.err));
        QCOMPARE(run.err.trimmed().count(QLatin1Char('\n')), 0);
        QVERIFY(run.err.startsWith(QStringLiteral("batchpilot-cli: ")));
    }

    void helpDocumentsEveryFlag() {
        const Run run = runCli({QStringLiteral("--help")});
        QCOMPARE(run.exitCode, 0);
        for (const auto* flag : {"--model", "--device", "--target-batch", "--steps", "--events", "--headroom", "--multiple-of",
                                 "--max-micro-batch", "--optimizer", "--lr", "--seed", "--image-size", "--norm",
                                 "--memory-report", "--check-equivalence"}) {
            QVERIFY2(run.out.contains(QLatin1String(flag)), flag);
        }
    }

    void configFileWithOverridingFlags() {
        QTemporaryDir dir;
        const QString config = dir.filePath(QStringLiteral("run.json"));
        const Run saved = runCli({QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--target-batch"),
                                  QStringLiteral("48"), QStringLiteral("--image-size"), QStringLiteral("3x8x8"),
                                  QStringLiteral("--steps"), QStringLiteral("50"), QStringLiteral("--save-config"), config});
        QVERIFY2(saved.exitCode == 0, qPrintable(saved.err));
        QVERIFY(QFile::exists(config));
        // The flag given after the file wins: 2 steps, not the 50 in the file.
        const Run run = runCli({QStringLiteral("--config"), config, QStringLiteral("--steps"), QStringLiteral("2")});
        QVERIFY2(run.exitCode == 0, qPrintable(run.err));
        QVERIFY(run.out.contains(QStringLiteral("step 2/2")));
        QVERIFY(run.out.contains(QStringLiteral("target batch 48")));
        const Run bad = runCli({QStringLiteral("--config"), dir.filePath(QStringLiteral("missing.json"))});
        QCOMPARE(bad.exitCode, 2);
        QVERIFY(bad.err.contains(QStringLiteral("cannot read the configuration")));
    }

    void resumesAfterSigkill() {
        QTemporaryDir dir;
        const QString checkpoints = dir.filePath(QStringLiteral("ckpt"));
        const QStringList common{QStringLiteral("--model"), QStringLiteral("cnn"), QStringLiteral("--image-size"),
                                 QStringLiteral("3x16x16"), QStringLiteral("--target-batch"), QStringLiteral("128"),
                                 QStringLiteral("--device"), QStringLiteral("virtual:16MiB"), QStringLiteral("--optimizer"),
                                 QStringLiteral("adam")};
        QProcess process;
        process.start(QStringLiteral(BATCHPILOT_CLI_PATH),
                      common + QStringList{QStringLiteral("--steps"), QStringLiteral("100000"), QStringLiteral("--checkpoint-dir"),
                                           checkpoints, QStringLiteral("--checkpoint-every"), QStringLiteral("1")});
        QVERIFY(process.waitForStarted());
        QString out;
        while (!out.contains(QStringLiteral("checkpoint saved at step 3"))) {
            QVERIFY2(process.waitForReadyRead(60000), "no checkpoint within a minute");
            out += QString::fromUtf8(process.readAllStandardOutput());
        }
        ::kill(pid_t(process.processId()), SIGKILL);  // no chance to clean up
        process.waitForFinished();
        QCOMPARE(process.exitStatus(), QProcess::CrashExit);

        const Run resumed = runCli(common + QStringList{QStringLiteral("--steps"), QStringLiteral("6"), QStringLiteral("--resume"), checkpoints});
        QVERIFY2(resumed.exitCode == 0, qPrintable(resumed.err));
        QVERIFY2(resumed.out.contains(QStringLiteral("resumed from step ")), qPrintable(resumed.out));
        QVERIFY(resumed.out.contains(QStringLiteral("done after 6 steps")));
        QVERIFY(!resumed.out.contains(QStringLiteral("step 1/6")));
    }

    void shortRunWritesJsonLines() {
        QTemporaryDir dir;
        const QString events = dir.filePath(QStringLiteral("run.jsonl"));
        const Run run = runCli({QStringLiteral("--model"), QStringLiteral("cnn"), QStringLiteral("--device"),
                                QStringLiteral("virtual:8MiB"), QStringLiteral("--target-batch"), QStringLiteral("1024"),
                                QStringLiteral("--steps"), QStringLiteral("3"), QStringLiteral("--image-size"),
                                QStringLiteral("3x16x16"), QStringLiteral("--events"), events});
        QVERIFY2(run.exitCode == 0, qPrintable(run.err));
        // Piped output: plain lines, one per step, no carriage returns.
        QVERIFY(!run.out.contains(QLatin1Char('\r')));
        QVERIFY(run.out.contains(QStringLiteral("trial  1: micro-batch      1  fit")));
        QVERIFY(run.out.contains(QStringLiteral("accumulation steps = target batch 1024")));
        QVERIFY(run.out.contains(QStringLiteral("step 3/3")));
        QFile file(events);
        QVERIFY(file.open(QIODevice::ReadOnly));
        QMap<QString, int> types;
        int lines = 0;
        while (!file.atEnd()) {
            const QByteArray line = file.readLine().trimmed();
            QJsonParseError error;
            const QJsonDocument doc = QJsonDocument::fromJson(line, &error);
            QVERIFY2(error.error == QJsonParseError::NoError, line.constData());
            QVERIFY(doc.isObject());
            const QJsonObject object = doc.object();
            QVERIFY(object.contains(QStringLiteral("time")));
            ++types[object.value(QStringLiteral("type")).toString()];
            ++lines;
        }
        QVERIFY(lines > 10);
        QCOMPARE(types.value(QStringLiteral("step")), 3);
        QCOMPARE(types.value(QStringLiteral("probe_finished")), 1);
        QVERIFY(types.value(QStringLiteral("probe_trial")) >= 3);
        QVERIFY(types.value(QStringLiteral("oom")) >= 1);
        QVERIFY(types.value(QStringLiteral("memory")) >= 1);
        QCOMPARE(types.value(QStringLiteral("memory_breakdown")), 1 + 3);
        QCOMPARE(types.value(QStringLiteral("run_summary")), 1);
    }

    void memoryReportAndEquivalenceCheck() {
        const Run run = runCli({QStringLiteral("--model"), QStringLiteral("cnn"), QStringLiteral("--device"),
                                QStringLiteral("virtual:16MiB"), QStringLiteral("--target-batch"), QStringLiteral("512"),
                                QStringLiteral("--optimizer"), QStringLiteral("adam"), QStringLiteral("--steps"),
                                QStringLiteral("4"), QStringLiteral("--quiet"), QStringLiteral("--memory-report"),
                                QStringLiteral("--check-equivalence"), QStringLiteral("0")});
        QVERIFY2(run.exitCode == 0, qPrintable(run.err));
        // Printed even with --quiet, because it was asked for.
        for (const char* expected :
             {"Memory report — cnn (", "trial  micro-batch  result", "fits", "Memory model: ≈ ", " per sample",
              "Chosen micro-batch ", "Where the memory goes on virtual:16MiB after step ", "parameters", "gradients",
              "optimizer state", "activations (micro-batch ", "free", "measured peak",
              "Equivalence check after step 1: 512 samples accumulated as ", "conv1.weight", "all parameters",
              "float32 rounding", "does not fit in the virtual device's budget"}) {
            QVERIFY2(run.out.contains(QString::fromUtf8(expected)), qPrintable(run.out + QStringLiteral("\nmissing: ") +
                                                                              QString::fromUtf8(expected)));
        }
        // The parts explain the measured peak (within 2%).
        const QRegularExpression share(QStringLiteral("\\(([0-9.]+)% of it\\)"));
        const auto match = share.match(run.out);
        QVERIFY(match.hasMatch());
        QVERIFY2(qAbs(match.captured(1).toDouble() - 100.0) <= 2.0, qPrintable(match.captured(0)));
        // The overall relative difference is float32 rounding (8 micro-batches of 64 on a net
        // without normalisation: about 1e-5).
        const QRegularExpression overall(QStringLiteral("all parameters\\s+\\d+\\s+(\\S+)\\s+(\\S+)"));
        const auto row = overall.match(run.out);
        QVERIFY(row.hasMatch());
        QVERIFY2(row.captured(2).toDouble() <= 1e-4, qPrintable(row.captured(0)));
    }
};

QTEST_GUILESS_MAIN(TestCli)
#include "tst_cli.moc"
