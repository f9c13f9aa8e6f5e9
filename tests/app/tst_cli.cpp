#include <QtTest>

#include <sched.h>

#include <algorithm>
#include <numeric>
#include <thread>

#include <QDeadlineTimer>
#include <QDir>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QStandardPaths>
#include <QRegularExpression>
#include <QTemporaryDir>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace {

struct Run {
    int exitCode;
    QString out;
    QString err;
};

/// Runs the CLI with `args`; through `wrapper` (a program and its arguments, the CLI's path and
/// `args` appended) where one is given.
Run runCli(const QStringList& args, const QStringList& wrapper = {}) {
    QProcess process;
    if (wrapper.isEmpty())
        process.start(QStringLiteral(BATCHPILOT_CLI_PATH), args);
    else
        process.start(wrapper.front(), wrapper.mid(1) + QStringList{QStringLiteral(BATCHPILOT_CLI_PATH)} + args);
    if (!process.waitForFinished(120000)) {
        process.kill();
        return {-1, {}, QStringLiteral("timed out")};
    }
    return {process.exitStatus() == QProcess::NormalExit ? process.exitCode() : -2,
            QString::fromUtf8(process.readAllStandardOutput()), QString::fromUtf8(process.readAllStandardError())};
}

/// The CPUs this process (and so the CLI it starts) may run on.
int cpusOfThisProcess() {
    cpu_set_t set;
    CPU_ZERO(&set);
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

/// `count` virtual devices of `size`, for --devices.
QString virtualDevices(int count, const QString& size = QStringLiteral("1MiB")) {
    QStringList devices;
    for (int i = 0; i < count; ++i) devices << QStringLiteral("virtual:") + size;
    return devices.join(QLatin1Char(','));
}

/// A ResNet with BatchNorm (running statistics that a resume must restore, which no loss shows),
/// Adam and one split for every run ("fastest" would time sizes by the clock): on virtual:16MiB at
/// 3x16x16, micro-batch 13, five to a training batch of 64.
QStringList resumableRun() {
    return {QStringLiteral("--model"),        QStringLiteral("resnet"),       QStringLiteral("--norm"),
            QStringLiteral("batch"),          QStringLiteral("--image-size"), QStringLiteral("3x16x16"),
            QStringLiteral("--optimizer"),    QStringLiteral("adam"),         QStringLiteral("--objective"),
            QStringLiteral("largest"),        QStringLiteral("--threads"),    QStringLiteral("1"),
            QStringLiteral("--no-run-folder")};
}

/// Python's torch (not BatchPilot's reader) compares two checkpoints: every parameter, buffer and
/// optimizer state tensor within 1e-6, the counters equal (compare_checkpoints.py).
void checkSameCheckpoint(const QString& checkpoint, const QString& reference) {
    QProcess compare;
    compare.start(QStringLiteral(BATCHPILOT_TEST_PYTHON),
                  {QStringLiteral(BATCHPILOT_COMPARE_CHECKPOINTS), checkpoint, reference, QStringLiteral("1e-6")});
    QVERIFY(compare.waitForFinished(120000));
    const QString said = QString::fromUtf8(compare.readAllStandardOutput() + compare.readAllStandardError());
    QVERIFY2(compare.exitStatus() == QProcess::NormalExit && compare.exitCode() == 0, qPrintable(said));
    QVERIFY2(said.contains(QStringLiteral(" 0 difference(s)")), qPrintable(said));
    qInfo("%s", qPrintable(said.trimmed()));
}

/// Starts the CLI with BATCHPILOT_HOLD_AT=`point` (core/base/hold_point.h) and waits, at most three
/// minutes, until it says it is held there; a process that ended or hung before is killed and the
/// test fails, naming what it said.
void startHeld(QProcess& process, const QStringList& args, const QString& point) {
    QProcessEnvironment environment = QProcessEnvironment::systemEnvironment();
    environment.insert(QStringLiteral("BATCHPILOT_HOLD_AT"), point);
    process.setProcessEnvironment(environment);
    process.start(QStringLiteral(BATCHPILOT_CLI_PATH), args);
    QVERIFY(process.waitForStarted());
    const QString held = QStringLiteral("held at ") + point.section(QLatin1Char(':'), 0, 0);
    QString err;
    const QDeadlineTimer deadline(std::chrono::minutes(3));
    while (!err.contains(held) && process.state() == QProcess::Running && !deadline.hasExpired()) {
        process.waitForReadyRead(1000);
        err += QString::fromUtf8(process.readAllStandardError());
    }
    if (!err.contains(held)) process.kill();  // a hang before the point
    QVERIFY2(err.contains(held), qPrintable(err + QString::fromUtf8(process.readAllStandardOutput())));
}

}  // namespace

class TestCli : public QObject {
    Q_OBJECT
    QTemporaryDir m_dir;

private Q_SLOTS:
    void badInputIsOneClearLine_data() {
        QTest::addColumn<QStringList>("args");
        QTest::addColumn<int>("exitCode");
        QTest::addColumn<QString>("message");
        QTest::newRow("unknown model") << QStringList{QStringLiteral("--model"), QStringLiteral("gpt5")} << 2
                                       << QStringLiteral("unknown model \"gpt5\": choose mlp, cnn or resnet");
        QTest::newRow("target 0") << QStringList{QStringLiteral("--target-batch"), QStringLiteral("0")} << 2
                                  << QStringLiteral("--target-batch: must be from 1 to 2147483648, got 0");
        QTest::newRow("target negative") << QStringList{QStringLiteral("--target-batch=-5")} << 2
                                         << QStringLiteral("--target-batch: must be from 1 to 2147483648, got -5");
        QTest::newRow("target not integer")
            << QStringList{QStringLiteral("--target-batch"), QStringLiteral("12.5")} << 2
            << QStringLiteral("--target-batch: expects a whole number, got \"12.5\"");
        // An empty value (an unset shell variable) is refused, not taken as "no file": --config ''
        // used to start a training run.
        for (const char* flag : {"--config", "--save-config", "--export-csv", "--events", "--data-path", "--model"}) {
            QTest::addRow("empty %s", flag)
                << QStringList{QString::fromLatin1(flag), QString()} << 2
                << QStringLiteral("%1: is empty: give a value, or leave the flag out").arg(QString::fromLatin1(flag));
        }
        QTest::newRow("no such device") << QStringList{QStringLiteral("--device"), QStringLiteral("cuda:99")} << 2
                                        << QStringLiteral("\"cuda:99\" does not exist");
        QTest::newRow("bad budget") << QStringList{QStringLiteral("--device"), QStringLiteral("virtual:abc")} << 2
                                    << QStringLiteral(
                                           "\"abc\" is neither a memory size (e.g. virtual:512MiB) nor a GPU preset");
        QTest::newRow("unknown flag") << QStringList{QStringLiteral("--turbo")} << 2
                                      << QStringLiteral("unknown flag \"--turbo\"");
        QTest::newRow("missing value") << QStringList{QStringLiteral("--steps")} << 2
                                       << QStringLiteral("--steps needs a value");
        QTest::newRow("value beyond 64 bits")
            << QStringList{QStringLiteral("--classes"), QStringLiteral("99999999999999999999")} << 2
            << QStringLiteral("--classes: expects a whole number from 2 to 1000000, got 99999999999999999999");
        QTest::newRow("unknown optimizer")
            << QStringList{QStringLiteral("--optimizer"), QStringLiteral("lion")} << 2
            << QStringLiteral("--optimizer: unknown optimizer \"lion\": choose sgd, adam or adamw");
        QTest::newRow("unknown objective")
            << QStringList{QStringLiteral("--objective"), QStringLiteral("quickest")} << 2
            << QStringLiteral("--objective: unknown probe objective \"quickest\": choose fastest or largest");
        QTest::newRow("unknown memory savers")
            << QStringList{QStringLiteral("--memory-savers"), QStringLiteral("fp8")} << 2
            << QStringLiteral(
                   "--memory-savers: unknown memory savers \"fp8\": choose auto, checkpoint, bf16, both, "
                   "fp16, checkpoint-fp16 or off");
        QTest::newRow("loss scale below 1") << QStringList{QStringLiteral("--loss-scale"), QStringLiteral("0.5")} << 2
                                            << QStringLiteral("--loss-scale: must be from 1 to 1e+30, got 0.5");
        QTest::newRow("unknown dataset")
            << QStringList{QStringLiteral("--data"), QStringLiteral("imagenet")} << 2
            << QStringLiteral("--data: unknown dataset \"imagenet\": choose synthetic, mnist, image-folder or csv");
        QTest::newRow("csv without a path")
            << QStringList{QStringLiteral("--data"), QStringLiteral("csv")} << 2
            << QStringLiteral("the csv dataset needs a data path (the CSV file to read)");
        QTest::newRow("max trials beyond the config's limit")
            << QStringList{QStringLiteral("--max-trials"), QStringLiteral("5000")} << 2
            << QStringLiteral("--max-trials: must be from 1 to 1000, got 5000");
        QTest::newRow("max micro-batch below the initial")
            << QStringList{QStringLiteral("--initial-micro-batch"), QStringLiteral("64"),
                           QStringLiteral("--max-micro-batch"), QStringLiteral("8")}
            << 2 << QStringLiteral("maximum micro-batch 8 is below the initial micro-batch 64");
        QTest::newRow("memory snapshot of a real device")
            << QStringList{QStringLiteral("--device"), QStringLiteral("cpu"), QStringLiteral("--memory-snapshot"),
                           QStringLiteral("snapshot.pickle")}
            << 2 << QStringLiteral("--memory-snapshot needs one virtual device");
        QTest::newRow("memory snapshot into a missing folder")
            << QStringList{QStringLiteral("--device"), QStringLiteral("virtual:64MiB"),
                           QStringLiteral("--memory-snapshot"), QStringLiteral("no-such-folder/snapshot.pickle")}
            << 2 << QStringLiteral("no folder \"no-such-folder\" for the memory snapshot");
        QTest::newRow("stray argument") << QStringList{QStringLiteral("mlp")} << 2
                                        << QStringLiteral("unexpected argument \"mlp\"");
        QTest::newRow("keep best by an unknown metric")
            << QStringList{QStringLiteral("--keep-best"), QStringLiteral("val_f1")} << 2
            << QStringLiteral(
                   "unknown validation metric \"val_f1\" to keep the best model by: one of val_loss, "
                   "val_accuracy, val_top5_accuracy, val_mse, val_mae");
        QTest::newRow("keep best by a regression metric for a classifier")
            << QStringList{QStringLiteral("--keep-best"), QStringLiteral("val_mse")} << 2
            << QStringLiteral("val_mse is measured for regression data only");
        QTest::newRow("keep best without validation")
            << QStringList{QStringLiteral("--keep-best"), QStringLiteral("val_loss"),
                           QStringLiteral("--validation-split"), QStringLiteral("0")}
            << 2 << QStringLiteral("needs validation, but --validation-split is 0");
        QTest::newRow("checkpoints in a run folder that is not written")
            << QStringList{QStringLiteral("--checkpoint-every"), QStringLiteral("5"), QStringLiteral("--no-run-folder")}
            << 2
            << QStringLiteral(
                   "--checkpoint-every without --checkpoint-dir keeps the checkpoints in the run's folder, "
                   "but --no-run-folder was given");
        QTest::newRow("budget too small")
            << QStringList{QStringLiteral("--model"),      QStringLiteral("resnet"),  QStringLiteral("--device"),
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

    /// Found by trying hostile input (issue 11): each gives one clear message, the documented
    /// exit status, and leaves what the user named as it was.
    void hostileInput_data() {
        QTest::addColumn<QStringList>("args");
        QTest::addColumn<int>("exitCode");
        QTest::addColumn<QString>("message");
        const auto base = [](QStringList more) {
            QStringList args{QStringLiteral("--model"),        QStringLiteral("mlp"),
                             QStringLiteral("--device"),       QStringLiteral("virtual:64MiB"),
                             QStringLiteral("--target-batch"), QStringLiteral("64"),
                             QStringLiteral("--steps"),        QStringLiteral("2"),
                             QStringLiteral("--threads"),      QStringLiteral("1")};
            return args + more;
        };
        const QString dir = m_dir.path();
        QTest::newRow("config is a folder")
            << base({QStringLiteral("--config"), dir}) << 2 << QStringLiteral("is not a regular file (a folder)");
        // 4096 processes: refused before one starts (at most 256; fewer when their ≈ 180 MiB each
        // exceed the host's free memory, said with the cost).
        QStringList many;
        for (int i = 0; i < 4096; ++i) many << QStringLiteral("virtual:1MiB");
        QTest::newRow("4096 devices") << QStringList{QStringLiteral("--model"), QStringLiteral("mlp"),
                                                     QStringLiteral("--devices"), many.join(QLatin1Char(','))}
                                      << 2
                                      << QStringLiteral("--devices: 4096 devices given, at most 256: one process each");
        // More ranks than the cores can carry (64 virtual devices on 2 cores started 64 processes,
        // 10.1 GB, each at 1/32 of its speed): refused before one starts, the cost said.
        const int cores = cpusOfThisProcess();
        if (cores > 0 && 4 * cores + 1 <= 256) {
            QTest::newRow("more ranks than cores carry")
                << QStringList{QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--devices"),
                               virtualDevices(4 * cores + 1)}
                << 2
                << QStringLiteral(
                       "--devices: %1 ranks train on the %2 CPUs this process may use (cpu and virtual devices "
                       "compute on the host), at most %3 (4 a CPU)")
                       .arg(4 * cores + 1)
                       .arg(cores)
                       .arg(4 * cores);
        }
        // A gigabyte of NUL bytes took 5.2 GB before it was refused: now at its first NUL.
        QTest::newRow("CSV of NUL bytes")
            << base({QStringLiteral("--data"), QStringLiteral("csv"), QStringLiteral("--data-path"),
                     dir + QStringLiteral("/nul.csv"), QStringLiteral("--target-column"), QStringLiteral("y")})
            << 2 << QStringLiteral("nul.csv holds a NUL byte (at byte 0): it is not a text file");
        // A class folder that is a link to "/": not walked (it read the whole file system).
        QTest::newRow("image-folder class linked to /")
            << base({QStringLiteral("--data"), QStringLiteral("image-folder"), QStringLiteral("--data-path"),
                     dir + QStringLiteral("/linkedout"), QStringLiteral("--image-size"), QStringLiteral("1x2x2")})
            << 2
            << QStringLiteral("has one class subfolder (\"cats\") (besides 1 linked folder(s) that lead outside it");
        QTest::newRow("config is a FIFO") << base({QStringLiteral("--config"), dir + QStringLiteral("/fifo")}) << 2
                                          << QStringLiteral("a FIFO, socket or device");
        QTest::newRow("config nested 100,000 deep")
            << base({QStringLiteral("--config"), dir + QStringLiteral("/deep.json")}) << 2
            << QStringLiteral("nests values more than 32 levels deep");
        QTest::newRow("config number beyond double")
            << base({QStringLiteral("--config"), dir + QStringLiteral("/overflow.json")}) << 2
            << QStringLiteral("cannot be read: [json.exception.out_of_range.406]");
        QTest::newRow("config value 2^63") << base({QStringLiteral("--config"), dir + QStringLiteral("/huge.json")})
                                           << 2 << QStringLiteral("got 9223372036854775808");
        QTest::newRow("checkpoint folder is a file")
            << base({QStringLiteral("--checkpoint-dir"), dir + QStringLiteral("/file")}) << 2
            << QStringLiteral("cannot create the checkpoint folder");
        QTest::newRow("checkpoint folder is /dev/full")
            << base({QStringLiteral("--checkpoint-dir"), QStringLiteral("/dev/full")}) << 2
            << QStringLiteral("the checkpoint folder \"/dev/full\"");
        // Only a regular file (or a new path) is written: a link would truncate what it points to,
        // a FIFO without a reader blocked the run for ever (issue 39).
        QTest::newRow("events to a device")
            << base({QStringLiteral("--events"), QStringLiteral("/dev/full"), QStringLiteral("--quiet")}) << 2
            << QStringLiteral("not writing the events file \"/dev/full\": the path is a device");
        QTest::newRow("events through a symlink")
            << base({QStringLiteral("--events"), dir + QStringLiteral("/link.json")}) << 2
            << QStringLiteral("the path is a symbolic link, and only a regular file is replaced");
        QTest::newRow("events to a FIFO") << base({QStringLiteral("--events"), dir + QStringLiteral("/fifo")}) << 2
                                          << QStringLiteral("the path is a FIFO (named pipe)");
        QTest::newRow("events to a folder")
            << base({QStringLiteral("--events"), dir}) << 2 << QStringLiteral("the path is a folder");
        QTest::newRow("save-config over a symlink")
            << base({QStringLiteral("--save-config"), dir + QStringLiteral("/link.json")}) << 2
            << QStringLiteral("the path is a symbolic link");
        QTest::newRow("save-config over a FIFO")
            << base({QStringLiteral("--save-config"), dir + QStringLiteral("/fifo")}) << 2
            << QStringLiteral("the path is a FIFO (named pipe)");
        QTest::newRow("CSV export over a symlink")
            << QStringList{QStringLiteral("--export-csv"), dir + QStringLiteral("/run"), QStringLiteral("--csv-out"),
                           dir + QStringLiteral("/link.json")}
            << 2
            << QStringLiteral("not writing the CSV") + QStringLiteral(" \"") + dir +
                   QStringLiteral("/link.json\": the path is a symbolic link");
        QTest::newRow("CSV export over a device")
            << QStringList{QStringLiteral("--export-csv"), dir + QStringLiteral("/run"), QStringLiteral("--csv-out"),
                           QStringLiteral("/dev/null")}
            << 2 << QStringLiteral("the path is a device");
        QTest::newRow("CSV export's own series.csv is a symlink")
            << QStringList{QStringLiteral("--export-csv"), dir + QStringLiteral("/linkedrun")} << 2
            << QStringLiteral("/linkedrun/series.csv\": the path is a symbolic link");
        // A key given twice: JSON readers differ on which value counts, so neither is taken.
        QTest::newRow("config with a key twice")
            << base({QStringLiteral("--config"), dir + QStringLiteral("/twice.json")}) << 2
            << QStringLiteral("gives \"probe.headroom\" twice (lines 4 and 5): keep the one you mean");
        QTest::newRow("CUDA memory fraction on a virtual device")
            << base({QStringLiteral("--cuda-memory-fraction"), QStringLiteral("0.5")}) << 2
            << QStringLiteral("a CUDA memory fraction caps a GPU's caching allocator, but the device is virtual:64MiB");
        QTest::newRow("threads 100000") << base({QStringLiteral("--threads"), QStringLiteral("100000")}) << 2
                                        << QStringLiteral("--threads: must be from 0 to 256, got 100000");
        QTest::newRow("image size with four parts")
            << base({QStringLiteral("--image-size"), QStringLiteral("3x32x32x5")}) << 2
            << QStringLiteral("--image-size: expects CxHxW such as 3x32x32, got \"3x32x32x5\"");
        QTest::newRow("image size too large")
            << base({QStringLiteral("--image-size"), QStringLiteral("3x100000x100000"), QStringLiteral("--samples"),
                     QStringLiteral("10")})
            << 2 << QStringLiteral("is too large");
        QTest::newRow("lr inf") << base({QStringLiteral("--lr"), QStringLiteral("inf")}) << 2
                                << QStringLiteral("--lr: expects a finite number, got \"inf\"");
        QTest::newRow("lr 1e300") << base({QStringLiteral("--lr"), QStringLiteral("1e300")}) << 2
                                  << QStringLiteral("--lr: must be above 0 and at most 1000000, got 1e300");
        QTest::newRow("classes 2^63-1") << base({QStringLiteral("--classes"), QStringLiteral("9223372036854775807")})
                                        << 2
                                        << QStringLiteral(
                                               "--classes: must be from 2 to 1000000, got 9223372036854775807");
        QTest::newRow("samples 2^63-1") << base({QStringLiteral("--samples"), QStringLiteral("9223372036854775807")})
                                        << 2
                                        << QStringLiteral(
                                               "--samples: must be from 1 to 100000000, got 9223372036854775807");
        QTest::newRow("validation split 1.5")
            << base({QStringLiteral("--validation-split"), QStringLiteral("1.5")}) << 2
            << QStringLiteral("--validation-split: must be from 0 to 0.9, got 1.5");
        QTest::newRow("validation data for synthetic data")
            << base({QStringLiteral("--validation-data"), dir + QStringLiteral("/file")}) << 2
            << QStringLiteral("given for synthetic data, which holds out samples of its own");
        QTest::newRow("validation data missing")
            << base({QStringLiteral("--data"), QStringLiteral("image-folder"), QStringLiteral("--data-path"),
                     dir + QStringLiteral("/oneclass"), QStringLiteral("--validation-data"),
                     dir + QStringLiteral("/nowhere")})
            << 2 << QStringLiteral("/nowhere does not exist: name a file or folder in the training data's format");
        QTest::newRow("headroom 0.9") << base({QStringLiteral("--headroom"), QStringLiteral("0.9")}) << 1
                                      << QStringLiteral("are usable with headroom 0.9; lower the headroom");
        QTest::newRow("single-class image folder")
            << base({QStringLiteral("--data"), QStringLiteral("image-folder"), QStringLiteral("--data-path"),
                     dir + QStringLiteral("/oneclass"), QStringLiteral("--image-size"), QStringLiteral("1x4x4")})
            << 2 << QStringLiteral("has one class subfolder (\"cats\"): a classifier needs at least two classes");
        QTest::newRow("target batch larger than the data")
            << base({QStringLiteral("--samples"), QStringLiteral("50")}) << 2
            << QStringLiteral("the target batch 64 is larger than the data");
        QTest::newRow("target batch with resume") << base({QStringLiteral("--resume"), dir}) << 2
                                                  << QStringLiteral("--target-batch cannot be given with --resume");
        QTest::newRow("epochs 2^63-1") << QStringList{QStringLiteral("--model"), QStringLiteral("mlp"),
                                                      QStringLiteral("--epochs"), QStringLiteral("9223372036854775807")}
                                       << 2
                                       << QStringLiteral(
                                              "--epochs: must be from 1 to 1000000, got 9223372036854775807");
    }
    void hostileInput() {
        QFETCH(QStringList, args);
        QFETCH(int, exitCode);
        QFETCH(QString, message);
        const Run run = runCli(args);
        QVERIFY2(run.exitCode == exitCode, qPrintable(QStringLiteral("exit %1: %2").arg(run.exitCode).arg(run.err)));
        QVERIFY2(run.err.contains(message), qPrintable(run.err));
        // Memory bounded by what is real (issue 39: ≤ 2 GB for any input): the largest resident
        // size of any process this test has waited for so far, this one included.
        struct rusage usage {};
        QCOMPARE(::getrusage(RUSAGE_CHILDREN, &usage), 0);
        QVERIFY2(usage.ru_maxrss < 2L * 1024 * 1024, qPrintable(QStringLiteral("%1 KiB").arg(usage.ru_maxrss)));
        // What the user named is still what it was.
        QFileInfo link(m_dir.filePath(QStringLiteral("link.json")));
        QVERIFY(link.isSymLink());
        QFile target(m_dir.filePath(QStringLiteral("target.json")));
        QVERIFY(target.open(QIODevice::ReadOnly));
        QCOMPARE(target.readAll(), QByteArray("{}"));
        struct stat fifo {};
        QVERIFY(::stat(QFile::encodeName(m_dir.filePath(QStringLiteral("fifo"))).constData(), &fifo) == 0 &&
                S_ISFIFO(fifo.st_mode));
        QVERIFY(QFileInfo(m_dir.filePath(QStringLiteral("file"))).isFile());
    }

    /// `batchpilot-cli ... | grep -m1 ...`: the output's reader goes away, and the next line written
    /// raises SIGPIPE. It ended the run at once, without a message or a checkpoint; now it stops
    /// as Ctrl-C does (exit 141, the checkpoint saved).

    // The CPUs counted are those the CLI may run on (its affinity, a container's quota), not the
    // machine's: on one CPU of a larger machine, 5 ranks are refused, 4 start.
    void ranksAreCountedOnTheCpusThisProcessMayUse() {
        if (QStandardPaths::findExecutable(QStringLiteral("taskset")).isEmpty())
            QSKIP("no taskset (util-linux) to run the CLI on one CPU");
        const QStringList oneCpu{QStringLiteral("taskset"), QStringLiteral("-c"), QStringLiteral("0")};
        const Run five = runCli({QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--devices"),
                                 virtualDevices(5), QStringLiteral("--no-run-folder")},
                                oneCpu);
        QCOMPARE(five.exitCode, 2);
        QVERIFY2(five.err.contains(QStringLiteral("5 ranks train on the 1 CPU this process may use")),
                 qPrintable(five.err));
        const Run four = runCli(
            {QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--devices"),
             virtualDevices(4, QStringLiteral("64MiB")), QStringLiteral("--steps"), QStringLiteral("1"),
             QStringLiteral("--image-size"), QStringLiteral("1x4x4"), QStringLiteral("--samples"), QStringLiteral("64"),
             QStringLiteral("--target-batch"), QStringLiteral("16"), QStringLiteral("--no-run-folder")},
            oneCpu);
        QVERIFY2(four.exitCode == 0, qPrintable(four.err));
        QVERIFY2(four.out.contains(QStringLiteral("4 ranks share 1 CPU")), qPrintable(four.out));
    }
    void closedOutputStopsTheRun() {
        QTemporaryDir dir;
        QProcess shell;
        shell.setWorkingDirectory(dir.path());
        shell.start(
            QStringLiteral("/bin/bash"),
            {QStringLiteral("-c"),
             QStringLiteral("\"$0\" --model mlp --device virtual:64MiB --target-batch 64 --steps 100000 "
                            "--threads 1 --checkpoint-dir ck --no-run-folder | grep -m1 '^step 1/' > /dev/null; "
                            "echo \"exit status ${PIPESTATUS[0]}\" >&2"),
             QStringLiteral(BATCHPILOT_CLI_PATH)});
        QVERIFY(shell.waitForFinished(120000));
        const QString err = QString::fromUtf8(shell.readAllStandardError());
        QVERIFY2(err.contains(QStringLiteral("stopped by signal 13")), qPrintable(err));
        QVERIFY2(err.contains(QStringLiteral("exit status 141")), qPrintable(err));
        // The reader left after the first step's line: that step is saved.
        QVERIFY2(err.contains(QStringLiteral("the checkpoint holds the last step")), qPrintable(err));
        QVERIFY(QFile::exists(dir.filePath(QStringLiteral("ck/checkpoint.pt"))));
    }

    /// SIGTERM during --export-csv: the export ends, its temporary file is removed, and no CSV
    /// appears (issue 39: a temporary .series.csv.XXXXXX was left behind).
    void stoppedExportLeavesNothing() {
        QTemporaryDir dir;
        QVERIFY(QDir(dir.path()).mkpath(QStringLiteral("run")));
        {
            // Two million step events (~200 MB): an export that takes seconds.
            std::ofstream events(dir.filePath(QStringLiteral("run/events.jsonl")).toStdString());
            for (int step = 1; step <= 2'000'000; ++step)
                events << R"({"type":"step","step":)" << step
                       << R"(,"time":1.5,"loss":2.25,"samples_seen":64,"micro_batch":8,"accumulation_steps":8,)"
                       << R"("target_batch":64,"samples_per_second":100.0,"step_seconds":0.5})" << '\n';
        }
        QProcess process;
        process.start(QStringLiteral(BATCHPILOT_CLI_PATH),
                      {QStringLiteral("--export-csv"), dir.filePath(QStringLiteral("run"))});
        QVERIFY(process.waitForStarted());
        // Stopped once the temporary file exists: the export is under way.
        const auto temporary = [&] {
            return QDir(dir.filePath(QStringLiteral("run")))
                .entryList({QStringLiteral(".series.csv.*")}, QDir::Files | QDir::Hidden);
        };
        QTRY_VERIFY_WITH_TIMEOUT(!temporary().isEmpty(), 30000);
        ::kill(pid_t(process.processId()), SIGTERM);
        QVERIFY(process.waitForFinished(60000));
        const QString err = QString::fromUtf8(process.readAllStandardError());
        QCOMPARE(process.exitStatus(), QProcess::NormalExit);
        QVERIFY2(process.exitCode() == 128 + SIGTERM,
                 qPrintable(QStringLiteral("exit %1: %2").arg(process.exitCode()).arg(err)));
        QVERIFY2(err.contains(QStringLiteral("stopped by signal 15: nothing was written")), qPrintable(err));
        QVERIFY2(temporary().isEmpty(), qPrintable(temporary().join(QLatin1Char(' '))));
        QVERIFY(!QFile::exists(dir.filePath(QStringLiteral("run/series.csv"))));
    }

    /// An events file that cannot be written to the end (here a file size limit, as a full disk
    /// would) ends the run with exit status 4 and says so; the training itself finishes.
    void eventsFileThatCannotBeWritten() {
        QTemporaryDir dir;
        QProcess shell;
        shell.setWorkingDirectory(dir.path());
        // A few KiB at most per file (ulimit -f counts blocks); SIGXFSZ ignored, so that a write past
        // it fails with EFBIG.
        shell.start(QStringLiteral("/bin/sh"),
                    {QStringLiteral("-c"),
                     QStringLiteral("trap '' XFSZ; ulimit -f 8; exec \"$0\" --model mlp --device virtual:64MiB "
                                    "--steps 4 --target-batch 16 --samples 256 --threads 1 --quiet --no-run-folder "
                                    "--events events.jsonl"),
                     QStringLiteral(BATCHPILOT_CLI_PATH)});
        QVERIFY(shell.waitForFinished(120000));
        const QString err = QString::fromUtf8(shell.readAllStandardError());
        QCOMPARE(shell.exitStatus(), QProcess::NormalExit);
        QVERIFY2(shell.exitCode() == 4, qPrintable(QStringLiteral("exit %1: %2").arg(shell.exitCode()).arg(err)));
        QVERIFY2(err.contains(QStringLiteral("the events file \"events.jsonl\"")), qPrintable(err));
    }

    /// A checkpoint with 256 bytes changed in the middle is refused as corrupt (exit 2), however
    /// the change lands: in tensor data or in the archive's structure.
    void damagedCheckpointIsRefused_data() {
        QTest::addColumn<double>("where");
        QTest::newRow("middle") << 0.5;
        QTest::newRow("near the end") << 0.97;
        QTest::newRow("near the start") << 0.02;
    }
    void damagedCheckpointIsRefused() {
        QFETCH(double, where);
        QTemporaryDir dir;
        const QStringList args{QStringLiteral("--model"),        QStringLiteral("mlp"),
                               QStringLiteral("--device"),       QStringLiteral("virtual:64MiB"),
                               QStringLiteral("--target-batch"), QStringLiteral("64"),
                               QStringLiteral("--steps"),        QStringLiteral("2"),
                               QStringLiteral("--threads"),      QStringLiteral("1")};
        const Run first = runCli(args + QStringList{QStringLiteral("--checkpoint-dir"), dir.path()});
        QVERIFY2(first.exitCode == 0, qPrintable(first.err));
        QFile file(dir.filePath(QStringLiteral("checkpoint.pt")));
        QVERIFY(file.open(QIODevice::ReadWrite));
        const qint64 at = qint64(where * double(file.size()));
        QVERIFY(file.seek(at));
        QByteArray bytes = file.read(256);
        for (auto& b : bytes) b = char(b ^ 0x5a);
        QVERIFY(file.seek(at));
        QCOMPARE(file.write(bytes), qint64(bytes.size()));
        file.close();
        const QByteArray damaged = [&] {
            QFile f(file.fileName());
            f.open(QIODevice::ReadOnly);
            return f.readAll();
        }();
        // A resumed run takes its target batch from the checkpoint: no --target-batch.
        QStringList resumeArgs = args;
        resumeArgs.removeAt(resumeArgs.indexOf(QStringLiteral("--target-batch")) + 1);
        resumeArgs.removeAll(QStringLiteral("--target-batch"));
        const Run resumed = runCli(resumeArgs + QStringList{QStringLiteral("--resume"), dir.path(),
                                                            QStringLiteral("--steps"), QStringLiteral("4")});
        QVERIFY2(resumed.exitCode == 2,
                 qPrintable(QStringLiteral("exit %1: %2").arg(resumed.exitCode).arg(resumed.err)));
        QVERIFY2(resumed.err.contains(QStringLiteral("is corrupt")), qPrintable(resumed.err));
        // The damaged file is left for the user to inspect, not overwritten.
        QFile after(file.fileName());
        QVERIFY(after.open(QIODevice::ReadOnly));
        QCOMPARE(after.readAll(), damaged);
    }

    /// Ctrl-C during training stops after the current micro-batch, saves, and says so in the exit
    /// status (128 + SIGINT).
    void interruptedRunSaysSo_data() {
        QTest::addColumn<int>("signal");
        QTest::newRow("SIGINT (Ctrl-C)") << SIGINT;
        QTest::newRow("SIGTERM (kill)") << SIGTERM;
        QTest::newRow("SIGHUP (the terminal closed)") << SIGHUP;
    }
    void interruptedRunSaysSo() {
        QFETCH(int, signal);
        QTemporaryDir dir;
        QProcess process;
        process.start(QStringLiteral(BATCHPILOT_CLI_PATH),
                      {QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--device"),
                       QStringLiteral("virtual:64MiB"), QStringLiteral("--target-batch"), QStringLiteral("64"),
                       QStringLiteral("--steps"), QStringLiteral("100000"), QStringLiteral("--threads"),
                       QStringLiteral("1"), QStringLiteral("--checkpoint-dir"), dir.path()});
        QVERIFY(process.waitForStarted());
        // Training has begun once the first step line is out.
        QTRY_VERIFY_WITH_TIMEOUT((process.waitForReadyRead(100), process.peek(1 << 20).contains("step ")), 60000);
        ::kill(pid_t(process.processId()), signal);
        QVERIFY(process.waitForFinished(60000));
        const QString err = QString::fromUtf8(process.readAllStandardError());
        QCOMPARE(process.exitStatus(), QProcess::NormalExit);
        QVERIFY2(process.exitCode() == 128 + signal,
                 qPrintable(QStringLiteral("exit %1: %2").arg(process.exitCode()).arg(err)));
        QVERIFY2(err.contains(QStringLiteral("stopped by signal %1").arg(signal)), qPrintable(err));
        QVERIFY(QFile::exists(dir.filePath(QStringLiteral("checkpoint.pt"))));
    }

    void initTestCase() {
        QVERIFY(m_dir.isValid());
        QVERIFY(::mkfifo(QFile::encodeName(m_dir.filePath(QStringLiteral("fifo"))).constData(), 0644) == 0);
        QFile target(m_dir.filePath(QStringLiteral("target.json")));
        QVERIFY(target.open(QIODevice::WriteOnly));
        target.write("{}");
        target.close();
        QVERIFY(QFile::link(target.fileName(), m_dir.filePath(QStringLiteral("link.json"))));
        QFile file(m_dir.filePath(QStringLiteral("file")));
        QVERIFY(file.open(QIODevice::WriteOnly));
        file.close();
        QFile deep(m_dir.filePath(QStringLiteral("deep.json")));
        QVERIFY(deep.open(QIODevice::WriteOnly));
        deep.write("{\"steps\": " + QByteArray(100000, '[') + QByteArray(100000, ']') + "}");
        deep.close();
        QFile huge(m_dir.filePath(QStringLiteral("huge.json")));
        QVERIFY(huge.open(QIODevice::WriteOnly));
        huge.write("{\"steps\": 9223372036854775808}");
        huge.close();
        // Found by fuzz/fuzz_run_config: a number the JSON reader cannot hold ended in std::terminate.
        QFile overflow(m_dir.filePath(QStringLiteral("overflow.json")));
        QVERIFY(overflow.open(QIODevice::WriteOnly));
        overflow.write("{\"steps\": 5555555555385860867772E204483}");
        overflow.close();
        QFile twice(m_dir.filePath(QStringLiteral("twice.json")));
        QVERIFY(twice.open(QIODevice::WriteOnly));
        twice.write("{\n  \"steps\": 2,\n  \"probe\": {\n    \"headroom\": 0.05,\n    \"headroom\": 0.5\n  }\n}\n");
        twice.close();
        // Run folders to export: one plain, one whose series.csv is a link to another file.
        for (const QString& run : {QStringLiteral("run"), QStringLiteral("linkedrun")}) {
            QVERIFY(QDir(m_dir.path()).mkpath(run));
            QFile events(m_dir.filePath(run + QStringLiteral("/events.jsonl")));
            QVERIFY(events.open(QIODevice::WriteOnly));
            events.write("{\"type\":\"state\",\"state\":\"starting\",\"time\":0,\"detail\":\"\"}\n");
            events.close();
        }
        QVERIFY(QFile::link(m_dir.filePath(QStringLiteral("target.json")),
                            m_dir.filePath(QStringLiteral("linkedrun/series.csv"))));
        QFile nul(m_dir.filePath(QStringLiteral("nul.csv")));
        QVERIFY(nul.open(QIODevice::WriteOnly));
        nul.write(QByteArray(3 << 20, '\0'));
        nul.close();
        // An image folder whose second class is a link to "/".
        QVERIFY(QDir(m_dir.path()).mkpath(QStringLiteral("linkedout/cats")));
        QVERIFY(QFile::link(QStringLiteral("/"), m_dir.filePath(QStringLiteral("linkedout/root"))));
        // An image folder with a single class: one grey 2x2 PGM image in oneclass/cats/.
        QVERIFY(QDir(m_dir.path()).mkpath(QStringLiteral("oneclass/cats")));
        QFile image(m_dir.filePath(QStringLiteral("oneclass/cats/a.pgm")));
        QVERIFY(image.open(QIODevice::WriteOnly));
        image.write(QByteArray("P5\n2 2\n255\n") + QByteArray("\x10\x80\xf0\x40", 4));
        image.close();
    }

    /// --list-devices says which LibTorch, BLAS and threads a run computes with, and warns when
    /// LibTorch calls the reference BLAS (forced here for this process alone).
    void reportsMathLibraries() {
        QProcess process;
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.insert(QStringLiteral("LD_LIBRARY_PATH"), QStringLiteral("/usr/lib/x86_64-linux-gnu/blas"));
        process.setProcessEnvironment(env);
        process.start(QStringLiteral(BATCHPILOT_CLI_PATH), {QStringLiteral("--list-devices")});
        QVERIFY(process.waitForFinished(60000));
        QCOMPARE(process.exitCode(), 0);
        const QString out = QString::fromUtf8(process.readAllStandardOutput());
        const QString err = QString::fromUtf8(process.readAllStandardError());
        QVERIFY2(
            QRegularExpression(QStringLiteral("LibTorch [0-9.]+ \\((CPU|CUDA)\\), BLAS: .+, [0-9]+ intra-op threads?"))
                .match(out)
                .hasMatch(),
            qPrintable(out));
        if (out.contains(QStringLiteral("BLAS library: "))) {
            // Debian's LibTorch calls the system BLAS: here the reference one.
            QVERIFY2(out.contains(QStringLiteral("BLAS: reference BLAS")), qPrintable(out));
            QVERIFY2(err.contains(QStringLiteral("warning: LibTorch is using the reference BLAS")), qPrintable(err));
        } else {
            // A LibTorch with its own BLAS built in (PyPI's, with MKL): nothing to warn about.
            QVERIFY2(out.contains(QStringLiteral("(in LibTorch)")), qPrintable(out));
            QVERIFY2(err.isEmpty(), qPrintable(err));
        }
    }

    void helpDocumentsEveryFlag() {
        const Run run = runCli({QStringLiteral("--help")});
        QCOMPARE(run.exitCode, 0);
        for (const auto* flag : {"--model", "--device", "--target-batch", "--steps", "--events", "--headroom",
                                 "--multiple-of", "--max-micro-batch", "--optimizer", "--lr", "--seed", "--image-size",
                                 "--norm", "--memory-report", "--check-equivalence"}) {
            QVERIFY2(run.out.contains(QLatin1String(flag)), flag);
        }
    }

    /// Whole numbers are read in decimal, leading zeros and all: CLI11 alone read "010" as octal 8
    /// (the check said 10), so --steps 010 trained 8 steps and --seed 0777 seeded with 511.
    void numbersAreReadAsWritten() {
        QTemporaryDir dir;
        const QString config = dir.filePath(QStringLiteral("config.json"));
        const Run run = runCli({QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--target-batch"),
                                QStringLiteral("012"), QStringLiteral("--steps"), QStringLiteral("010"),
                                QStringLiteral("--seed"), QStringLiteral("0777"), QStringLiteral("--check-equivalence"),
                                QStringLiteral("08"), QStringLiteral("--save-config"), config});
        QVERIFY2(run.exitCode == 0, qPrintable(run.err));
        QFile file(config);
        QVERIFY(file.open(QIODevice::ReadOnly));
        const QJsonObject saved = QJsonDocument::fromJson(file.readAll()).object();
        QCOMPARE(saved.value(QStringLiteral("target_batch")).toInteger(), 12);
        QCOMPARE(saved.value(QStringLiteral("steps")).toInteger(), 10);
        QCOMPARE(saved.value(QStringLiteral("seed")).toInteger(), 777);
        // Not a number in decimal: refused as before, saying what was given.
        const Run hex = runCli({QStringLiteral("--steps"), QStringLiteral("0x10"), QStringLiteral("--save-config"),
                                dir.filePath(QStringLiteral("other.json"))});
        QCOMPARE(hex.exitCode, 2);
        QVERIFY2(hex.err.contains(QStringLiteral("0x10")), qPrintable(hex.err));
    }

    /// Text that is not UTF-8 — a Latin-1 CSV header, column name, runs folder and file name —
    /// reaches the JSON the run writes: it used to end the process (nlohmann::json's type_error,
    /// signal 6). Now the run trains and records it, each invalid byte as U+FFFD.
    void textThatIsNotUtf8() {
        QTemporaryDir dir;
        QFile csv(dir.filePath(QStringLiteral("latin1.csv")));
        QVERIFY(csv.open(QIODevice::WriteOnly));
        QByteArray rows(
            "pr\xe9"
            "ce,x,y\n");
        for (int i = 0; i < 40; ++i) rows += QByteArray::number(i % 2) + ',' + QByteArray::number(i) + ",1\n";
        csv.write(rows);
        csv.close();
        // QProcess takes arguments as Unicode text: a shell passes the Latin-1 bytes as they are.
        QProcess shell;
        shell.setWorkingDirectory(dir.path());
        shell.start(QStringLiteral("/bin/sh"),
                    {QStringLiteral("-c"),
                     QStringLiteral("exec \"$0\" --model mlp --device virtual:64MiB --steps 2 --target-batch 16 "
                                    "--threads 1 --quiet --data csv --data-path latin1.csv "
                                    "--target-column \"$(printf 'pr\\351ce')\" --runs-dir \"$(printf 'r\\351s')\" "
                                    "--events \"$(printf '\\351v.jsonl')\""),
                     QStringLiteral(BATCHPILOT_CLI_PATH)});
        QVERIFY(shell.waitForFinished(120000));
        const QString err = QString::fromUtf8(shell.readAllStandardError());
        QCOMPARE(shell.exitStatus(), QProcess::NormalExit);
        QVERIFY2(shell.exitCode() == 0, qPrintable(err));
        // The run folder's configuration names the column, its invalid byte replaced. (Paths as
        // bytes: QString cannot hold a Latin-1 file name.)
        namespace fs = std::filesystem;
        const fs::path runs = fs::path(dir.path().toStdString()) / "r\xe9s";
        std::vector<fs::path> folders;
        for (const auto& entry : fs::directory_iterator(runs)) folders.push_back(entry.path());
        QCOMPARE(folders.size(), size_t(1));
        std::ifstream config(folders.front() / "config.json");
        QVERIFY(config.good());
        const std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
        const QJsonObject saved = QJsonDocument::fromJson(QByteArray::fromStdString(text)).object();
        QCOMPARE(saved.value(QStringLiteral("data")).toObject().value(QStringLiteral("target_column")).toString(),
                 QStringLiteral("pr\uFFFDce"));
        QVERIFY(fs::exists(fs::path(dir.path().toStdString()) / "\xe9v.jsonl"));
    }

    void configFileWithOverridingFlags() {
        QTemporaryDir dir;
        const QString config = dir.filePath(QStringLiteral("run.json"));
        const Run saved =
            runCli({QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--target-batch"),
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

    // Kill -9 at three moments, resume, and the last update's weights, BatchNorm buffers and Adam
    // state equal those of a run that was never interrupted (read by Python's torch, not by
    // BatchPilot). The process is held at the moment by BATCHPILOT_HOLD_AT (core/base/hold_point.h),
    // so each kill lands where its row says, whatever the machine's speed.
    void sigkillThenResumeTrainsAsIfUninterrupted_data() {
        QTest::addColumn<QString>("holdAt");
        QTest::addColumn<QString>("heldDevice");  ///< the device of the run that is killed
        QTest::addColumn<int>("resumesFrom");
        // The run is killed while it probes another device after resuming from step 3: its
        // checkpoint is still step 3's.
        QTest::newRow("during a probe") << QStringLiteral("probe-trial:2") << QStringLiteral("virtual:24MiB/exact")
                                        << 3;
        // resnet at 3x16x16 on virtual:16MiB/exact: micro-batch 13, five to a batch of 64 (step 1's
        // first are the probe's trials, not counted), one checkpoint after each step: killed
        // inside step 6.
        QTest::newRow("between micro-batches") << QStringLiteral("micro-batch:18") << QString() << 5;
        // Half of step 4's checkpoint written to its temporary file: step 3's is the latest.
        QTest::newRow("while a checkpoint is written") << QStringLiteral("checkpoint-write:4") << QString() << 3;
    }
    void sigkillThenResumeTrainsAsIfUninterrupted() {
        QFETCH(QString, holdAt);
        QFETCH(QString, heldDevice);
        QFETCH(int, resumesFrom);
        constexpr int kSteps = 8;
        const QStringList common = resumableRun();
        // Exact counting: the micro-batch and the kill points below are counted in its sizes.
        const QStringList device{QStringLiteral("--device"), QStringLiteral("virtual:16MiB/exact")};
        QTemporaryDir dir;
        const QString checkpoints = dir.filePath(QStringLiteral("ckpt"));
        const QString checkpoint = checkpoints + QStringLiteral("/checkpoint.pt");
        const QString reference = dir.filePath(QStringLiteral("straight"));

        // The run that is never interrupted, its last checkpoint the reference.
        const Run straight =
            runCli(common + device +
                   QStringList{QStringLiteral("--target-batch"), QStringLiteral("64"), QStringLiteral("--steps"),
                               QString::number(kSteps), QStringLiteral("--checkpoint-dir"), reference});
        QVERIFY2(straight.exitCode == 0, qPrintable(straight.err));
        QVERIFY2(straight.out.contains(QStringLiteral("micro-batch 13")), qPrintable(straight.out));

        // Held and killed with SIGKILL: no chance to clean up.
        const auto killWhenHeld = [&](const QStringList& args, const QString& point) {
            QProcess process;
            startHeld(process, args, point);
            if (QTest::currentTestFailed()) return;
            ::kill(pid_t(process.processId()), SIGKILL);
            process.waitForFinished();
            QCOMPARE(process.exitStatus(), QProcess::CrashExit);
        };
        const QStringList checkpointEveryStep{QStringLiteral("--checkpoint-dir"), checkpoints,
                                              QStringLiteral("--checkpoint-every"), QStringLiteral("1")};
        if (heldDevice.isEmpty()) {
            killWhenHeld(common + device + checkpointEveryStep +
                             QStringList{QStringLiteral("--target-batch"), QStringLiteral("64"),
                                         QStringLiteral("--steps"), QStringLiteral("100000")},
                         holdAt);
        } else {
            const Run first = runCli(common + device + checkpointEveryStep +
                                     QStringList{QStringLiteral("--target-batch"), QStringLiteral("64"),
                                                 QStringLiteral("--steps"), QString::number(resumesFrom)});
            QVERIFY2(first.exitCode == 0, qPrintable(first.err));
            killWhenHeld(common + checkpointEveryStep +
                             QStringList{QStringLiteral("--device"), heldDevice, QStringLiteral("--steps"),
                                         QStringLiteral("100000"), QStringLiteral("--resume"), checkpoints},
                         holdAt);
        }
        if (QTest::currentTestFailed()) return;
        // A half-written temporary file may stay behind; the latest checkpoint is whole.
        if (holdAt.startsWith(QStringLiteral("checkpoint-write")))
            QVERIFY(QFileInfo(checkpoint + QStringLiteral(".tmp")).size() > 0);

        if (holdAt.startsWith(QStringLiteral("micro-batch"))) {
            // On another training set the checkpoint's sampler position would walk other samples:
            // refused as bad input, and the checkpoint is left as it was.
            const QByteArray saved = [&] {
                QFile file(checkpoint);
                return file.open(QIODevice::ReadOnly) ? file.readAll() : QByteArray();
            }();
            QVERIFY(!saved.isEmpty());
            const Run otherSet =
                runCli(common + device +
                       QStringList{QStringLiteral("--steps"), QStringLiteral("9"), QStringLiteral("--samples"),
                                   QStringLiteral("1000"), QStringLiteral("--resume"), checkpoints});
            QCOMPARE(otherSet.exitCode, 2);
            QVERIFY2(otherSet.err.contains(QStringLiteral("was written while training on 4096 samples, but this run "
                                                          "trains on 1000")),
                     qPrintable(otherSet.err));
            QFile unchanged(checkpoint);
            QVERIFY(unchanged.open(QIODevice::ReadOnly));
            QCOMPARE(unchanged.readAll(), saved);
        }

        const Run resumed = runCli(
            common + device +
            QStringList{QStringLiteral("--steps"), QString::number(kSteps), QStringLiteral("--resume"), checkpoints});
        QVERIFY2(resumed.exitCode == 0, qPrintable(resumed.err));
        // It says which step and batch it continues at, and where its checkpoints go.
        QVERIFY2(resumed.out.contains(QStringLiteral("resumed from step %1 ").arg(resumesFrom)),
                 qPrintable(resumed.out));
        QVERIFY2(resumed.out.contains(QStringLiteral("at the checkpoint's target batch 64")), qPrintable(resumed.out));
        QVERIFY2(resumed.out.contains(QStringLiteral("checkpoints replace ") + checkpoint), qPrintable(resumed.out));
        QVERIFY(resumed.out.contains(QStringLiteral("done after %1 steps").arg(kSteps)));

        checkSameCheckpoint(checkpoint, reference + QStringLiteral("/checkpoint.pt"));
    }

    // Two runs saving into one checkpoint folder (two resumes of the same checkpoint) overwrote
    // each other's files and both ended with exit 4: the second is refused at once, naming the
    // first, and the folder is free again when the first ends, even by SIGKILL.
    void twoRunsCannotShareACheckpointFolder() {
        QTemporaryDir dir;
        const QString checkpoints = dir.filePath(QStringLiteral("ckpt"));
        const QStringList args =
            resumableRun() + QStringList{QStringLiteral("--device"),         QStringLiteral("virtual:16MiB"),
                                         QStringLiteral("--target-batch"),   QStringLiteral("64"),
                                         QStringLiteral("--steps"),          QStringLiteral("2"),
                                         QStringLiteral("--checkpoint-dir"), checkpoints};
        QProcess first;
        startHeld(first, args, QStringLiteral("micro-batch:1"));
        if (QTest::currentTestFailed()) return;
        const Run second = runCli(args);
        QCOMPARE(second.exitCode, 2);
        QVERIFY2(second.err.contains(QStringLiteral("the checkpoint folder \"%1\" is in use by another run "
                                                    "(process %2)")
                                         .arg(checkpoints)
                                         .arg(first.processId())),
                 qPrintable(second.err));
        ::kill(pid_t(first.processId()), SIGKILL);
        first.waitForFinished();
        const Run third = runCli(args);
        QVERIFY2(third.exitCode == 0, qPrintable(third.err));
    }

    // A link inside a class folder that leads out of the image folder is skipped with a warning,
    // not walked (a link to "/" read the whole file system, /proc included, for 13 s), and a
    // file too large to be an image is refused by its size.
    void linksOutOfAnImageFolderAreNotFollowed() {
        QTemporaryDir dir;
        for (const char* name : {"cats", "dogs"}) {
            QVERIFY(QDir(dir.path()).mkpath(QString::fromLatin1(name)));
            for (int i = 0; i < 4; ++i) {
                QFile image(dir.filePath(QStringLiteral("%1/%2.pgm").arg(QString::fromLatin1(name)).arg(i)));
                QVERIFY(image.open(QIODevice::WriteOnly));
                image.write(QByteArray("P5\n2 2\n255\n") + QByteArray(4, char(i * 60 + (name[0] == 'c' ? 0 : 20))));
            }
        }
        QVERIFY(QFile::link(QStringLiteral("/"), dir.filePath(QStringLiteral("dogs/root"))));
        // A sparse 2.5 GB "image": refused by its size, not read (it took 5.3 GB and 21 s).
        {
            QFile sparse(dir.filePath(QStringLiteral("dogs/x.png")));
            QVERIFY(sparse.open(QIODevice::WriteOnly));
            QVERIFY(sparse.resize(qint64{2500} << 20));
        }
        const Run run = runCli({QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--device"),
                                QStringLiteral("virtual:64MiB"), QStringLiteral("--steps"), QStringLiteral("1"),
                                QStringLiteral("--data"), QStringLiteral("image-folder"), QStringLiteral("--data-path"),
                                dir.path(), QStringLiteral("--image-size"), QStringLiteral("1x2x2"),
                                QStringLiteral("--target-batch"), QStringLiteral("4"),
                                QStringLiteral("--no-run-folder"), QStringLiteral("--threads"), QStringLiteral("1")});
        QVERIFY2(run.exitCode == 0, qPrintable(run.err));
        QVERIFY2(run.out.contains(QStringLiteral("warning: 1 symbolic link(s) lead outside %1 and were skipped (e.g. "
                                                 "%1/dogs/root)")
                                      .arg(dir.path())),
                 qPrintable(run.out));
        // Nothing from outside was read: no file of the system is named, as unreadable or not an image.
        QVERIFY2(!run.out.contains(QStringLiteral("not images by their extension")), qPrintable(run.out));
        QVERIFY2(run.out.contains(QStringLiteral("warning: 1 of 9 image files in %1 could not be read and were "
                                                 "skipped: %1/dogs/x.png (the file holds 2.44 GiB, more than any "
                                                 "image read here")
                                      .arg(dir.path())),
                 qPrintable(run.out));
        struct rusage usage {};
        QCOMPARE(::getrusage(RUSAGE_CHILDREN, &usage), 0);
        QVERIFY2(usage.ru_maxrss < 2L * 1024 * 1024, qPrintable(QStringLiteral("%1 KiB").arg(usage.ru_maxrss)));
    }

    // A virtual GPU larger than the machine (virtual:8000000TB) allocated host memory until the
    // machine ran out: it is held to the machine's memory, and the run says so.
    void budgetLargerThanTheMachine() {
        const Run run = runCli({QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--device"),
                                QStringLiteral("virtual:8000000TB"), QStringLiteral("--steps"), QStringLiteral("1"),
                                QStringLiteral("--target-batch"), QStringLiteral("32"), QStringLiteral("--samples"),
                                QStringLiteral("256"), QStringLiteral("--no-run-folder"), QStringLiteral("--threads"),
                                QStringLiteral("1")});
        QVERIFY2(run.exitCode == 0, qPrintable(run.err));
        QVERIFY2(run.out.contains(QStringLiteral("is more than this machine's memory")) &&
                     run.out.contains(QStringLiteral("where a virtual GPU keeps its tensors: it holds at most")),
                 qPrintable(run.out));
        // The limit reached the allocator: the probe's usable memory is within the machine's.
        const QRegularExpression usable(QStringLiteral("usable memory ([0-9.]+) (MiB|GiB)"));
        const auto match = usable.match(run.out);
        QVERIFY2(match.hasMatch(), qPrintable(run.out));
        const double usableBytes = match.captured(1).toDouble() *
                                   (match.captured(2) == QStringLiteral("GiB") ? 1024.0 * 1024 * 1024 : 1024.0 * 1024);
        QFile meminfo(QStringLiteral("/proc/meminfo"));
        QVERIFY(meminfo.open(QIODevice::ReadOnly));
        const QRegularExpression total(QStringLiteral("MemTotal:\\s+(\\d+) kB"));
        const auto totalMatch = total.match(QString::fromLatin1(meminfo.readAll()));
        QVERIFY(totalMatch.hasMatch());
        QVERIFY2(usableBytes <= totalMatch.captured(1).toDouble() * 1024,
                 qPrintable(QStringLiteral("usable %1 bytes").arg(usableBytes)));
    }

    // A disk that fills up during the run (tests/app/full_disk.cpp, preloaded: the third save
    // meets "No space left on device" half-way): the run goes on and ends with exit status 4, each
    // failed save is said, the second save's checkpoint stays whole with no partial file beside
    // it, and resuming from it trains as if nothing had happened.
    void diskFillsDuringTheRun() {
        constexpr int kSteps = 6;
        const QStringList common =
            resumableRun() + QStringList{QStringLiteral("--device"), QStringLiteral("virtual:16MiB")};
        QTemporaryDir dir;
        const QString reference = dir.filePath(QStringLiteral("straight"));
        const Run straight = runCli(common + QStringList{QStringLiteral("--target-batch"), QStringLiteral("64"),
                                                         QStringLiteral("--steps"), QString::number(kSteps),
                                                         QStringLiteral("--checkpoint-dir"), reference});
        QVERIFY2(straight.exitCode == 0, qPrintable(straight.err));
        const qint64 checkpointBytes = QFileInfo(reference + QStringLiteral("/checkpoint.pt")).size();
        QVERIFY(checkpointBytes > 0);

        const QString full = dir.filePath(QStringLiteral("full"));
        QProcess process;
        QProcessEnvironment environment = QProcessEnvironment::systemEnvironment();
        environment.insert(QStringLiteral("LD_PRELOAD"), QStringLiteral(BATCHPILOT_FULL_DISK));
        environment.insert(QStringLiteral("BATCHPILOT_FULL_DISK_DIR"), full);
        environment.insert(QStringLiteral("BATCHPILOT_FULL_DISK_BYTES"), QString::number(checkpointBytes * 5 / 2));
        // Sanitizer builds: the preloaded library comes before the sanitizer's runtime.
        environment.insert(QStringLiteral("ASAN_OPTIONS"), environment.value(QStringLiteral("ASAN_OPTIONS")) +
                                                               QStringLiteral(":verify_asan_link_order=0"));
        process.setProcessEnvironment(environment);
        process.start(
            QStringLiteral(BATCHPILOT_CLI_PATH),
            common + QStringList{QStringLiteral("--target-batch"), QStringLiteral("64"), QStringLiteral("--steps"),
                                 QString::number(kSteps), QStringLiteral("--checkpoint-dir"), full,
                                 QStringLiteral("--checkpoint-every"), QStringLiteral("1")});
        QVERIFY(process.waitForFinished(120000));
        const QString err = QString::fromUtf8(process.readAllStandardError());
        QCOMPARE(process.exitStatus(), QProcess::NormalExit);
        QVERIFY2(process.exitCode() == 4, qPrintable(err));
        // Said at the end (even with --quiet), with the reason and what to do.
        const QString message = QStringLiteral(
                                    "could not write the checkpoint \"%1/checkpoint.pt\": No space left on "
                                    "device; the previous checkpoint, if any, is unchanged: free some "
                                    "space there, or save checkpoints to another folder")
                                    .arg(full);
        QVERIFY2(err.contains(QStringLiteral("error: ") + message), qPrintable(err));
        // Saves 3 to 6 and the one after the last validation failed, each said.
        const QString out = QString::fromUtf8(process.readAllStandardOutput());
        QCOMPARE(out.count(QStringLiteral("warning: checkpoint not saved: ") + message), kSteps - 2 + 1);
        // Only the last whole checkpoint is there (and the folder's lock): no partial temporary file.
        QCOMPARE(QDir(full).entryList(QDir::Files | QDir::Hidden | QDir::System),
                 (QStringList{QStringLiteral(".batchpilot.lock"), QStringLiteral("checkpoint.pt")}));

        const Run resumed = runCli(
            common + QStringList{QStringLiteral("--steps"), QString::number(kSteps), QStringLiteral("--resume"), full});
        QVERIFY2(resumed.exitCode == 0, qPrintable(resumed.err));
        QVERIFY2(resumed.out.contains(QStringLiteral("resumed from step 2 ")), qPrintable(resumed.out));
        checkSameCheckpoint(full + QStringLiteral("/checkpoint.pt"), reference + QStringLiteral("/checkpoint.pt"));
    }

    void shortRunWritesJsonLines() {
        QTemporaryDir dir;
        const QString events = dir.filePath(QStringLiteral("run.jsonl"));
        const Run run =
            runCli({QStringLiteral("--model"), QStringLiteral("cnn"), QStringLiteral("--device"),
                    QStringLiteral("virtual:8MiB"), QStringLiteral("--target-batch"), QStringLiteral("1024"),
                    QStringLiteral("--steps"), QStringLiteral("3"), QStringLiteral("--image-size"),
                    QStringLiteral("3x16x16"), QStringLiteral("--events"), events});
        QVERIFY2(run.exitCode == 0, qPrintable(run.err));
        // Piped output: plain lines, one per step, no carriage returns.
        QVERIFY(!run.out.contains(QLatin1Char('\r')));
        QVERIFY(run.out.contains(QStringLiteral("trial  1: micro-batch      1  fit")));
        // The plan as a sum that adds up: 1024 samples in micro-batches of at most the probed size.
        const QRegularExpression plan(
            QStringLiteral("micro-batch (\\d+); target batch 1024 = (\\d+) × (\\d+)"
                           "(?: \\+ (\\d+) × (\\d+))? accumulated"));
        const QRegularExpressionMatch planned = plan.match(run.out);
        QVERIFY2(planned.hasMatch(), qPrintable(run.out));
        const qint64 probed = planned.captured(1).toLongLong();
        qint64 parts = planned.captured(2).toLongLong();
        qint64 samples = parts * planned.captured(3).toLongLong();
        if (!planned.captured(4).isEmpty()) {
            parts += planned.captured(4).toLongLong();
            samples += planned.captured(4).toLongLong() * planned.captured(5).toLongLong();
        }
        QCOMPARE(samples, qint64(1024));
        QVERIFY(planned.captured(3).toLongLong() <= probed);  // the largest micro-batch fits
        QCOMPARE(parts, (1024 + probed - 1) / probed);        // and no more of them than needed
        QVERIFY(run.out.contains(QStringLiteral("step 3/3")));
        QFile file(events);
        QVERIFY(file.open(QIODevice::ReadOnly));
        QMap<QString, int> types;
        int lines = 0;
        QMap<qint64, QList<qint64>> sizesByStep;  // the micro-batches each step committed
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
            if (object.value(QStringLiteral("type")).toString() == QStringLiteral("micro_batch")) {
                QList<qint64>& sizes = sizesByStep[object.value(QStringLiteral("step")).toInteger()];
                // Index 0 starts the step's batch over (after an OOM in backward): the micro-batches
                // before it were trained again.
                if (object.value(QStringLiteral("index")).toInteger() == 0) sizes.clear();
                sizes << object.value(QStringLiteral("size")).toInteger();
            }
        }
        // Each step line says how many micro-batches ran and the largest, with "≤" where they
        // differed: as the events file lists them.
        for (qint64 step = 1; step <= 3; ++step) {
            const QList<qint64> sizes = sizesByStep.value(step);
            QVERIFY(!sizes.isEmpty());
            const qint64 largest = *std::max_element(sizes.begin(), sizes.end());
            const qint64 total = std::accumulate(sizes.begin(), sizes.end(), qint64{0});
            QCOMPARE(total, qint64(1024));
            const QString expected = QStringLiteral("step %1/3 ").arg(step);
            const QString said = QStringLiteral("micro-batch %1%2 × %3  ")
                                     .arg(largest * sizes.size() == total ? QString() : QStringLiteral("≤"))
                                     .arg(largest)
                                     .arg(sizes.size());
            const QString stepLine = run.out.section(expected, 1).section(QLatin1Char('\n'), 0, 0);
            QVERIFY2(stepLine.contains(said), qPrintable(expected + stepLine + QStringLiteral(" | expected ") + said));
        }
        QVERIFY(lines > 10);
        QCOMPARE(types.value(QStringLiteral("step")), 3);
        QCOMPARE(types.value(QStringLiteral("probe_finished")), 1);
        QVERIFY(types.value(QStringLiteral("probe_trial")) >= 3);
        QVERIFY(types.value(QStringLiteral("oom")) >= 1);
        QVERIFY(types.value(QStringLiteral("memory")) >= 1);
        QCOMPARE(types.value(QStringLiteral("memory_breakdown")), 1 + 3);
        QCOMPARE(types.value(QStringLiteral("run_summary")), 1);
        // The run's end is validated on the synthetic data's own 410 held-out samples.
        QCOMPARE(types.value(QStringLiteral("validation")), 1);
        QVERIFY2(run.out.contains(QStringLiteral("validation after step 3: loss ")) &&
                     run.out.contains(QStringLiteral("on 410 held-out samples")),
                 qPrintable(run.out));
        QVERIFY2(run.out.contains(QStringLiteral("\nvalidation: loss ")), qPrintable(run.out));
    }

    void memoryReportAndEquivalenceCheck() {
        const Run run =
            runCli({QStringLiteral("--model"), QStringLiteral("cnn"), QStringLiteral("--device"),
                    QStringLiteral("virtual:16MiB"), QStringLiteral("--target-batch"), QStringLiteral("512"),
                    QStringLiteral("--optimizer"), QStringLiteral("adam"), QStringLiteral("--steps"),
                    QStringLiteral("4"), QStringLiteral("--quiet"), QStringLiteral("--memory-report"),
                    QStringLiteral("--check-equivalence"), QStringLiteral("0"),
                    // 4 steps end before a timing would decide; the report of a timed choice has
                    // its own test (tst_memory_report).
                    QStringLiteral("--objective"), QStringLiteral("largest")});
        QVERIFY2(run.exitCode == 0, qPrintable(run.err));
        // Printed even with --quiet, because it was asked for.
        for (const char* expected :
             {"Memory report — cnn (", "trial  micro-batch  result", "fits", "Memory model: ≈ ", " per sample",
              "Chosen micro-batch ", "Where the memory goes on virtual:16MiB after step ", "parameters", "gradients",
              "optimizer state", "activations (micro-batch ", "free", "measured peak",
              "Equivalence check after step 1: 512 samples accumulated as ", "conv1.weight", "all parameters",
              "float32 rounding", "does not fit in the virtual device's budget"}) {
            QVERIFY2(run.out.contains(QString::fromUtf8(expected)),
                     qPrintable(run.out + QStringLiteral("\nmissing: ") + QString::fromUtf8(expected)));
        }
        // The parts explain the measured peak (within 2%).
        const QRegularExpression share(QStringLiteral("explain [0-9.]+ MiB of it \\(([0-9.]+)%\\)"));
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

    /// Issue 13: a run leaves a folder (configuration, events, summary with the validation
    /// results) under --runs-dir, and --export-csv turns its events into one CSV table.
    void runFolderAndCsvExport() {
        QTemporaryDir dir;
        // A CSV classification table: 300 rows, 3 classes that the features separate.
        const QString table = dir.filePath(QStringLiteral("table.csv"));
        {
            QFile file(table);
            QVERIFY(file.open(QIODevice::WriteOnly));
            file.write("a,b,label\n");
            for (int i = 0; i < 300; ++i) {
                const int label = i % 3;
                file.write(QStringLiteral("%1,%2,%3\n")
                               .arg(label * 2 + (i % 7) * 0.1)
                               .arg(-label + (i % 5) * 0.1)
                               .arg(label)
                               .toUtf8());
            }
        }
        const QString runs = dir.filePath(QStringLiteral("runs"));
        const Run run =
            runCli({QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--data"), QStringLiteral("csv"),
                    QStringLiteral("--data-path"), table, QStringLiteral("--target-column"), QStringLiteral("label"),
                    QStringLiteral("--target-batch"), QStringLiteral("30"), QStringLiteral("--epochs"),
                    QStringLiteral("3"), QStringLiteral("--lr"), QStringLiteral("0.1"), QStringLiteral("--runs-dir"),
                    runs, QStringLiteral("--threads"), QStringLiteral("1")});
        QVERIFY2(run.exitCode == 0, qPrintable(run.err + run.out));
        // 30 of 300 held out: 270 train, 9 steps per epoch, validated after each epoch.
        for (const char* step : {"validation after step 9:", "validation after step 18:", "validation after step 27:"})
            QVERIFY2(run.out.contains(QLatin1String(step)), qPrintable(run.out));
        QVERIFY2(run.out.contains(QStringLiteral("on 30 held-out samples")), qPrintable(run.out));
        const QStringList folders = QDir(runs).entryList(QDir::Dirs | QDir::NoDotAndDotDot);
        QCOMPARE(folders.size(), 1);
        QVERIFY2(folders.front().endsWith(QStringLiteral("-mlp-csv")), qPrintable(folders.front()));
        const QString folder = runs + QLatin1Char('/') + folders.front();
        QVERIFY2(run.out.contains(QStringLiteral("run folder: ") + folder), qPrintable(run.out));
        const auto readJson = [](const QString& path) {
            QFile file(path);
            return file.open(QIODevice::ReadOnly) ? QJsonDocument::fromJson(file.readAll()).object() : QJsonObject();
        };
        const QJsonObject config = readJson(folder + QStringLiteral("/config.json"));
        QCOMPARE(config.value(QStringLiteral("data")).toObject().value(QStringLiteral("path")).toString(), table);
        const QJsonObject summary = readJson(folder + QStringLiteral("/summary.json"));
        QCOMPARE(summary.value(QStringLiteral("state")).toString(), QStringLiteral("finished"));
        QCOMPARE(summary.value(QStringLiteral("steps")).toInt(), 27);
        QCOMPARE(summary.value(QStringLiteral("dataset_size")).toInt(), 270);
        const QJsonObject metrics = summary.value(QStringLiteral("metrics")).toObject();
        const QJsonObject accuracy = metrics.value(QStringLiteral("val_accuracy")).toObject();
        QCOMPARE(accuracy.value(QStringLiteral("count")).toInt(), 3);
        QCOMPARE(accuracy.value(QStringLiteral("last_step")).toInt(), 27);
        QVERIFY(accuracy.value(QStringLiteral("best")).toDouble() >= accuracy.value(QStringLiteral("last")).toDouble());
        QCOMPARE(metrics.value(QStringLiteral("train_loss")).toObject().value(QStringLiteral("count")).toInt(), 27);

        // The CSV: a header, then one row per value; every step's training loss and every validation.
        const Run exported = runCli({QStringLiteral("--export-csv"), folder});
        QVERIFY2(exported.exitCode == 0, qPrintable(exported.err));
        QFile csv(folder + QStringLiteral("/series.csv"));
        QVERIFY(csv.open(QIODevice::ReadOnly | QIODevice::Text));
        const QStringList lines = QString::fromUtf8(csv.readAll()).split(QLatin1Char('\n'), Qt::SkipEmptyParts);
        QCOMPARE(lines.front(), QStringLiteral("series,step,samples_seen,time_s,micro_batch,value"));
        std::map<QString, int> rows;
        std::vector<double> accuracies;
        for (int i = 1; i < lines.size(); ++i) {
            const QStringList cells = lines[i].split(QLatin1Char(','));
            QCOMPARE(cells.size(), 6);
            ++rows[cells[0]];
            bool number = false;
            cells[5].toDouble(&number);
            QVERIFY2(number, qPrintable(lines[i]));
            if (cells[0] == QStringLiteral("val_accuracy")) {
                accuracies.push_back(cells[5].toDouble());
                QCOMPARE(cells[2].toInt(), cells[1].toInt() * 30);  // samples seen
            }
        }
        QCOMPARE(rows[QStringLiteral("train_loss")], 27);
        QCOMPARE(rows[QStringLiteral("val_accuracy")], 3);
        QCOMPARE(rows[QStringLiteral("val_loss")], 3);
        QVERIFY(rows[QStringLiteral("memory_allocated_bytes")] > 0);
        QVERIFY(std::abs(accuracies.back() - accuracy.value(QStringLiteral("last")).toDouble()) < 1e-8);
        QVERIFY2(exported.out.contains(QStringLiteral("rows from")), qPrintable(exported.out));

        // Not a run folder, and a runs folder that cannot be made: one line each, exit 2.
        const Run notRun = runCli({QStringLiteral("--export-csv"), dir.path()});
        QCOMPARE(notRun.exitCode, 2);
        QVERIFY2(notRun.err.contains(QStringLiteral("is not a run folder: it has no events.jsonl")),
                 qPrintable(notRun.err));
        const Run blocked = runCli({QStringLiteral("--steps"), QStringLiteral("1"), QStringLiteral("--runs-dir"),
                                    table + QStringLiteral("/runs")});
        QCOMPARE(blocked.exitCode, 2);
        QVERIFY2(blocked.err.contains(QStringLiteral("cannot create the runs folder")), qPrintable(blocked.err));
    }

    /// Checkpoints asked for without a folder go into the run folder (checkpoint/, the best
    /// model in checkpoint/best), which config.json and summary.json record; the best model is
    /// the one a run resumed from it scores again.
    void keepsBestModelInRunFolder() {
        QTemporaryDir dir;
        const QString runs = dir.filePath(QStringLiteral("runs"));
        // A resumed run keeps its checkpoint's target batch: --target-batch only for the first.
        const QStringList common{QStringLiteral("--model"),   QStringLiteral("mlp"),  QStringLiteral("--samples"),
                                 QStringLiteral("320"),       QStringLiteral("--lr"), QStringLiteral("0.2"),
                                 QStringLiteral("--threads"), QStringLiteral("1")};
        const Run run = runCli(common + QStringList{QStringLiteral("--target-batch"), QStringLiteral("32"),
                                                    QStringLiteral("--steps"), QStringLiteral("8"),
                                                    QStringLiteral("--validate-every"), QStringLiteral("2"),
                                                    QStringLiteral("--keep-best"), QStringLiteral("val_accuracy"),
                                                    QStringLiteral("--checkpoint-every"), QStringLiteral("4"),
                                                    QStringLiteral("--runs-dir"), runs});
        QVERIFY2(run.exitCode == 0, qPrintable(run.err + run.out));
        const QStringList folders = QDir(runs).entryList(QDir::Dirs | QDir::NoDotAndDotDot);
        QCOMPARE(folders.size(), 1);
        const QString folder = runs + QLatin1Char('/') + folders.front();
        const QString checkpoints = folder + QStringLiteral("/checkpoint");
        QVERIFY2(run.out.contains(QStringLiteral("checkpoints: ") + checkpoints), qPrintable(run.out));
        QVERIFY2(run.out.contains(QStringLiteral("best model so far (val_accuracy ")), qPrintable(run.out));
        QVERIFY(QFile::exists(checkpoints + QStringLiteral("/checkpoint.pt")));
        QVERIFY(QFile::exists(checkpoints + QStringLiteral("/best/checkpoint.pt")));
        const auto readJson = [](const QString& path) {
            QFile file(path);
            return file.open(QIODevice::ReadOnly) ? QJsonDocument::fromJson(file.readAll()).object() : QJsonObject();
        };
        const QJsonObject config =
            readJson(folder + QStringLiteral("/config.json")).value(QStringLiteral("checkpoint")).toObject();
        QCOMPARE(config.value(QStringLiteral("directory")).toString(), checkpoints);
        QCOMPARE(config.value(QStringLiteral("keep_best")).toString(), QStringLiteral("val_accuracy"));
        // The summary's best accuracy (the first pass that reached it) is the kept model's.
        const QJsonObject summary = readJson(folder + QStringLiteral("/summary.json"));
        const QJsonObject accuracy =
            summary.value(QStringLiteral("metrics")).toObject().value(QStringLiteral("val_accuracy")).toObject();
        const QJsonObject kept = summary.value(QStringLiteral("best_checkpoint")).toObject();
        QCOMPARE(kept.value(QStringLiteral("path")).toString(), checkpoints + QStringLiteral("/best/checkpoint.pt"));
        QCOMPARE(kept.value(QStringLiteral("metric")).toString(), QStringLiteral("val_accuracy"));
        QCOMPARE(kept.value(QStringLiteral("value")).toDouble(), accuracy.value(QStringLiteral("best")).toDouble());
        const int bestStep = kept.value(QStringLiteral("step")).toInt();
        QCOMPARE(bestStep, accuracy.value(QStringLiteral("best_step")).toInt());
        QCOMPARE(summary.value(QStringLiteral("checkpoint")).toObject().value(QStringLiteral("step")).toInt(), 8);
        // The CLI's closing lines name the kept model, and their best pass (shown when it was not
        // the last) is the same one.
        QVERIFY2(run.out.contains(QStringLiteral("best model by val_accuracy (")), qPrintable(run.out));
        static const QRegularExpression bestPass(QStringLiteral("; best [^\n]* after step (\\d+)"));
        if (const auto m = bestPass.match(run.out); m.hasMatch()) QCOMPARE(m.captured(1).toInt(), bestStep);

        // Resumed from the best model up to its own step: its validation accuracy again.
        const Run resumed = runCli(
            common + QStringList{QStringLiteral("--steps"), QString::number(bestStep), QStringLiteral("--resume"),
                                 checkpoints + QStringLiteral("/best"), QStringLiteral("--checkpoint-dir"),
                                 dir.filePath(QStringLiteral("other")), QStringLiteral("--no-run-folder")});
        QVERIFY2(resumed.exitCode == 0, qPrintable(resumed.err + resumed.out));
        const QString expected = QStringLiteral("validation after step %1: loss ").arg(bestStep);
        QVERIFY2(resumed.out.contains(expected), qPrintable(resumed.out));
        const QString accuracyText =
            QString::asprintf("accuracy %.1f%%", 100.0 * accuracy.value(QStringLiteral("best")).toDouble());
        QVERIFY2(resumed.out.contains(accuracyText), qPrintable(resumed.out + QStringLiteral(" vs ") + accuracyText));
    }
};

QTEST_GUILESS_MAIN(TestCli)
#include "tst_cli.moc"
