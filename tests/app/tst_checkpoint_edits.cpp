// Checkpoints edited by hand, resumed as a user would (issue 66): one checkpoint written by
// batchpilot-cli (an MLP trained with Adam for two steps), copies of it with one field changed by
// Python's torch (edit_checkpoint.py: an independent writer, each copy with a valid header and
// checksum), and batchpilot-cli --resume on each copy. Every copy must be refused as bad input
// (exit 2) with a message that names the file, the field, the value and what was expected, before
// a step is trained: never a crash, never training on nonsense. The CLI runs under a 4 GiB
// address-space limit, so that a count the file claims cannot make it allocate for it.

#include <QtTest>

#include "tests/sanitized.h"

#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QRegularExpression>
#include <QTemporaryDir>

namespace {

struct Edit {
    const char* name;
    const char* fields;  ///< JSON: the fields edit_checkpoint.py changes
    const char* said;    ///< in the refusal; empty: the copy resumes
};

// The run writes a checkpoint of 6 parameter tensors (fc1, fc2 and out, 64 hidden units), Adam's
// two moments for each, after training on 64 samples.
const Edit kEdits[] = {
    // The control: rewritten by Python's torch, unchanged. It resumes, so that every refusal
    // below is the field's, not the writer's.
    {"unchanged", "{}", ""},
    {"target batch 0", R"({"target_batch": 0})", "target_batch: expected an integer from 1 to 2147483648, got 0"},
    {"target batch 2^31", R"({"target_batch": 2147483648})",
     "holds target_batch 2147483648, larger than the data: synthetic 1x4x4, 2 classes, 64 samples"},
    {"step -1", R"({"step": -1})", "step: expected an integer from 0 to 1099511627776, got -1"},
    {"negative sample count", R"({"samples_seen": -5})", "samples_seen: expected an integer from 0 up, got -5"},
    {"sampler position past the data", R"({"sampler_position": 100000})",
     "sampler_position: expected an integer from 0 to 64, got 100000"},
    {"negative sampler position", R"({"sampler_position": -1})",
     "sampler_position: expected an integer from 0 to 64, got -1"},
    {"position past the data, sample count not recorded", R"({"sampler_position": 65, "training_samples": -1})",
     "holds sampler_position 65, past the 64 samples this run trains on"},
    {"negative epoch", R"({"sampler_epoch": -1})", "sampler_epoch: expected an integer from 0 up, got -1"},
    {"negative learning rate", R"({"learning_rate": -0.1})",
     "learning_rate: expected a number in (0, 1e+06], got -0.1"},
    {"NaN learning rate", R"({"learning_rate": "nan"})", "learning_rate: expected a number in (0, 1e+06], got nan"},
    // 0 is written by a run stopped before its first probe finished: probed again on resume.
    {"negative micro-batch", R"({"micro_batch": -8})", "micro_batch: expected an integer from 0 to 2147483648, got -8"},
    {"no training samples", R"({"training_samples": 0})",
     "training_samples: expected an integer from 1 up, got 0 (or -1: not recorded)"},
    {"negative loss scale", R"({"loss_scale": -1.0})", "loss_scale: expected a number in [1, 1e+30], got -1"},
    {"infinite best value", R"({"best_value": "inf"})",
     "best_value: expected a finite number (or NaN: none yet), got inf"},
    {"unknown optimizer", R"({"optimizer_kind": 7})", "optimizer_kind: expected an integer from 0 to 2, got 7"},
    {"int64 weights", R"({"parameter0": {"dtype": "int64"}})",
     "parameter0 (fc1.weight): expected a float32 tensor, as the model's, got int64"},
    {"NaN weights", R"({"parameter2": {"fill": "nan"}})",
     "parameter2 (fc2.weight): expected finite values, got NaN or infinity"},
    {"weights of another shape", R"({"parameter1": {"shape": [3]}})",
     "does not match this model's parameters (parameter1 (fc1.bias) has shape [3], the model's [64]"},
    {"a billion parameters claimed", R"({"parametercount": 1000000000})",
     "does not match this model's parameters (parametercount is 1000000000, this model has 6"},
    {"a billion moments claimed", R"({"firstcount": 1000000000})",
     "firstcount: expected 0 (no step yet) or 6 (one per parameter), got 1000000000"},
    {"Adam state at step 0", R"({"optimizer_steps": 0})",
     "optimizer_steps: expected an integer from 1 up where the adam state exists (it was made by a step), got 0"},
    {"negative optimizer steps", R"({"optimizer_steps": -3})",
     "optimizer_steps: expected an integer from 0 to 1099511627776, got -3"},
    {"Adam state torn", R"({"secondcount": 0})",
     "firstcount is 6 but secondcount is 0: adam keeps both moving averages for every parameter"},
    {"negative squared-gradient average", R"({"second4": {"fill": -1}})",
     "second4: expected values of at least 0 (adam's average of squared gradients), got -1"},
    {"moment of another shape", R"({"first3": {"shape": [2, 2]}})",
     "first3 (fc2.bias): expected the shape of its parameter, but it has shape [2, 2]"},
    {"int64 moments", R"({"second1": {"dtype": "int64"}})",
     "second1 (fc1.bias): expected a float32 tensor, as the model's, got int64"},
    {"unknown format", R"({"format": 2})", "has an unknown format version (2)"},
};

struct Run {
    int exitCode;
    QString out;
    QString err;
};

// A sanitizer's runtime reserves terabytes of address space for its shadow memory at start: the
// CLI built with one (as this test is) cannot start under an address-space limit.
using batchpilot::test::kSanitized;

/// The CLI under a 4 GiB address-space limit (`ulimit -v`; none under a sanitizer), its exit
/// status (-2: a crash).
Run runCli(const QStringList& args) {
    QProcess process;
    process.start(QStringLiteral("/bin/sh"),
                  QStringList{QStringLiteral("-c"),
                              kSanitized ? QStringLiteral("exec \"$0\" \"$@\"")
                                         : QStringLiteral("ulimit -v 4194304; exec \"$0\" \"$@\""),
                              QStringLiteral(BATCHPILOT_CLI_PATH)} +
                      args);
    if (!process.waitForFinished(120000)) {
        process.kill();
        return {-1, {}, QStringLiteral("timed out")};
    }
    return {process.exitStatus() == QProcess::NormalExit ? process.exitCode() : -2,
            QString::fromUtf8(process.readAllStandardOutput()), QString::fromUtf8(process.readAllStandardError())};
}

/// A small run: 6 parameter tensors (the MLP's three layers), Adam, 64 samples of 1x4x4.
QStringList run() {
    return {QStringLiteral("--model"),        QStringLiteral("mlp"),
            QStringLiteral("--width"),        QStringLiteral("8"),
            QStringLiteral("--image-size"),   QStringLiteral("1x4x4"),
            QStringLiteral("--classes"),      QStringLiteral("2"),
            QStringLiteral("--samples"),      QStringLiteral("64"),
            QStringLiteral("--optimizer"),    QStringLiteral("adam"),
            QStringLiteral("--device"),       QStringLiteral("virtual:64MiB"),
            QStringLiteral("--objective"),    QStringLiteral("largest"),
            QStringLiteral("--threads"),      QStringLiteral("1"),
            QStringLiteral("--no-run-folder")};
}

}  // namespace

class TestCheckpointEdits : public QObject {
    Q_OBJECT
    QTemporaryDir m_dir;

    QString copyOf(const char* name) const { return m_dir.filePath(QString::fromUtf8(name)); }

private Q_SLOTS:
    /// The checkpoint, then every edited copy in one Python run (torch takes seconds to import).
    void initTestCase() {
        QVERIFY(m_dir.isValid());
        const QString source = m_dir.filePath(QStringLiteral("source"));
        const Run first = runCli(run() + QStringList{QStringLiteral("--target-batch"), QStringLiteral("16"),
                                                     QStringLiteral("--steps"), QStringLiteral("2"),
                                                     QStringLiteral("--checkpoint-dir"), source});
        QVERIFY2(first.exitCode == 0, qPrintable(first.err));
        QJsonObject edits;
        for (const Edit& edit : kEdits) {
            edits.insert(copyOf(edit.name) + QStringLiteral("/checkpoint.pt"),
                         QJsonDocument::fromJson(QByteArray(edit.fields)).object());
        }
        QFile editsFile(m_dir.filePath(QStringLiteral("edits.json")));
        QVERIFY(editsFile.open(QIODevice::WriteOnly));
        editsFile.write(QJsonDocument(edits).toJson());
        editsFile.close();
        QProcess python;
        python.start(QStringLiteral(BATCHPILOT_TEST_PYTHON),
                     {QStringLiteral(BATCHPILOT_EDIT_CHECKPOINT), source + QStringLiteral("/checkpoint.pt"),
                      editsFile.fileName()});
        QVERIFY(python.waitForFinished(120000));
        QVERIFY2(python.exitStatus() == QProcess::NormalExit && python.exitCode() == 0,
                 python.readAllStandardError().constData());
    }

    void editedCheckpointIsRefused_data() {
        QTest::addColumn<QString>("directory");
        QTest::addColumn<QString>("said");
        for (const Edit& edit : kEdits) QTest::newRow(edit.name) << copyOf(edit.name) << QString::fromUtf8(edit.said);
    }
    void editedCheckpointIsRefused() {
        QFETCH(QString, directory);
        QFETCH(QString, said);
        const Run resumed = runCli(
            run() + QStringList{QStringLiteral("--steps"), QStringLiteral("4"), QStringLiteral("--resume"), directory});
        const QString both = QStringLiteral("exit %1\n%2%3").arg(resumed.exitCode).arg(resumed.out, resumed.err);
        const QRegularExpression trainedStep(QStringLiteral("^step \\d"), QRegularExpression::MultilineOption);
        if (said.isEmpty()) {
            QVERIFY2(resumed.exitCode == 0, qPrintable(both));
            QVERIFY2(resumed.out.contains(trainedStep), qPrintable(both));
            return;
        }
        QVERIFY2(resumed.exitCode == 2, qPrintable(both));
        QVERIFY2(resumed.err.contains(said), qPrintable(both));
        // The file (or its folder, for what is judged against this run's data) and what to do.
        QVERIFY2(resumed.err.contains(directory), qPrintable(both));
        if (!said.contains(QStringLiteral("does not match this model")) && !said.contains(QStringLiteral("format")))
            QVERIFY2(resumed.err.contains(QStringLiteral("resume from an intact checkpoint or start a new run")),
                     qPrintable(both));
        QVERIFY2(!resumed.out.contains(trainedStep), qPrintable(both));
    }
};

QTEST_GUILESS_MAIN(TestCheckpointEdits)
#include "tst_checkpoint_edits.moc"
