// Run folders: what a run writes (configuration, events, summary with last and best of each
// metric), reading them back (list, curves), renaming and deleting, and the CSV export —
// from events made here, so the expected numbers are known.

#include <QtTest>
#include "tests/test_main.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/config/run_config.h"
#include "core/records/run_folder.h"
#include "core/records/run_history.h"
#include "core/records/series_export.h"

namespace tst_run_folder {

using namespace batchpilot::core;
namespace fs = std::filesystem;

namespace {

StepMetrics step(int64_t n, int64_t target, double loss) {
    StepMetrics m;
    m.time = 0.5 * static_cast<double>(n);
    m.step = n;
    m.samplesSeen = n * target;
    m.loss = loss;
    m.microBatch = target / 2;
    m.accumulationSteps = 2;
    m.targetBatch = target;
    m.samplesPerSecond = 1000.0 + static_cast<double>(n);
    return m;
}

ValidationDone validation(int64_t n, int64_t target, double loss, double accuracy) {
    ValidationDone v;
    v.time = 0.5 * static_cast<double>(n) + 0.1;
    v.step = n;
    v.samplesSeen = n * target;
    v.samples = 100;
    v.loss = loss;
    v.accuracy = accuracy;
    v.microBatch = 100;
    return v;
}

/// A run of `steps` steps at `target`, validated every 2 steps, accuracy 0.5, 0.8, 0.7, ...
std::string recordRun(const std::string& runs, int64_t target, int steps, std::time_t when) {
    TrainerOptions o;
    o.model.name = "mlp";
    o.targetBatch = target;
    auto folder = RunFolder::create(runs, o, when);
    if (!folder) qFatal("%s", folder.error().c_str());
    RunSummary s;
    s.model = "mlp";
    s.dataset = "synthetic";
    s.datasetSize = 1000;
    s.device = "virtual:64MiB";
    s.targetBatch = target;
    (*folder)->onEvent(s);
    const double accuracies[] = {0.5, 0.8, 0.7, 0.75};
    for (int n = 1; n <= steps; ++n) {
        (*folder)->onEvent(step(n, target, 2.0 / n));
        if (n % 2 == 0) (*folder)->onEvent(validation(n, target, 1.0 / n, accuracies[(n / 2 - 1) % 4]));
    }
    (*folder)->onEvent(OomEvent{1.0, 1, Phase::Forward, 64, 1024, "out of memory", true, 32, 0, {}});
    (*folder)->onEvent(RunStateChanged{9.0, RunState::Finished, "done"});
    if (!(*folder)->error().empty()) qFatal("%s", (*folder)->error().c_str());
    return (*folder)->path();
}

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

}  // namespace

class TestRunFolder : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void writesConfigEventsAndSummary();
    void namesAreNewAndPlain();
    void listsAndReadsRunsBack();
    void renamesAndDeletesOnlyRuns();
    void exportsOneTidyTable();
    void refusesAFolderItCannotCreate();
    void keepsCheckpointsInside();
    void resumedRunsKeepTheBestModel();
    void countsEveryRanksOoms();
};

/// A run resumed from a best model's folder saves next to it, not over it.
void TestRunFolder::resumedRunsKeepTheBestModel() {
    QCOMPARE(resumedCheckpointDirectory("runs/a/checkpoint"), std::string("runs/a/checkpoint"));
    QCOMPARE(resumedCheckpointDirectory("runs/a/checkpoint/best"), std::string("runs/a/checkpoint"));
    QCOMPARE(resumedCheckpointDirectory("runs/a/checkpoint/best/"), std::string("runs/a/checkpoint"));
    QCOMPARE(resumedCheckpointDirectory("/ckpt/bestever"), std::string("/ckpt/bestever"));
}

/// Several devices: the summary's OOMs are the job's, rank 0's own and those the other ranks
/// reported; the reports' probe trials that ran out of memory are probing, not OOMs recovered.
void TestRunFolder::countsEveryRanksOoms() {
    QTemporaryDir dir;
    TrainerOptions o;
    auto folder = RunFolder::create(dir.path().toStdString(), o, 5);
    QVERIFY(folder.has_value());
    (*folder)->onEvent(OomEvent{1.0, 1, Phase::Forward, 16, 0, "rank 0's", true, 8, 0, {}});
    RankProbed report;
    report.time = 2.0;
    report.rank = 1;
    report.device = "virtual:48MiB";
    report.trials.push_back(ProbeTrial{1.5, 1, 1, 64, false, false, 0, 1024, 0.1});
    report.ooms = {OomEvent{1.6, 1, Phase::Backward, 32, 0, "rank 1's", true, 16, 0, {}},
                   OomEvent{1.7, 1, Phase::Forward, 16, 0, "rank 1's again", true, 8, 0, {}}};
    (*folder)->onEvent(report);
    (*folder)->flush();
    const auto summary = readRunSummary((*folder)->path());
    QVERIFY(summary.has_value());
    QCOMPARE((*summary)["ooms"].get<int64_t>(), int64_t{3});
}

/// Checkpoints asked for without a directory go into the run's folder; a directory the user
/// named is kept; the summary says where the latest checkpoint and the best model are.
void TestRunFolder::keepsCheckpointsInside() {
    QTemporaryDir dir;
    const std::string runs = dir.path().toStdString();
    TrainerOptions none;
    QVERIFY(RunFolder::create(runs, none, 1).has_value());
    QVERIFY(none.checkpoint.directory.empty());  // nothing asked for: no checkpoints

    TrainerOptions named;
    named.checkpoint.directory = "/elsewhere";
    named.checkpoint.keepBest = "val_loss";
    QVERIFY(RunFolder::create(runs, named, 2).has_value());
    QCOMPARE(named.checkpoint.directory, std::string("/elsewhere"));

    for (const bool interval : {true, false}) {
        TrainerOptions o;
        if (interval)
            o.checkpoint.everySteps = 5;
        else
            o.checkpoint.keepBest = "val_accuracy";
        auto folder = RunFolder::create(runs, o, interval ? 3 : 4);
        QVERIFY(folder.has_value());
        const std::string inside = (*folder)->path() + "/checkpoint";
        QCOMPARE(o.checkpoint.directory, inside);
        const auto config = loadRunConfig((*folder)->path() + "/config.json");
        QVERIFY2(config.has_value(), config ? "" : config.error().c_str());
        QCOMPARE(config->checkpoint.directory, inside);
        QCOMPARE(config->checkpoint.keepBest, o.checkpoint.keepBest);
        QCOMPARE(config->checkpoint.everySteps, o.checkpoint.everySteps);
        if (interval) continue;

        (*folder)->onEvent(CheckpointSaved{1.0, 2, inside + "/best/checkpoint.pt", "val_accuracy", 0.5});
        (*folder)->onEvent(CheckpointSaved{2.0, 5, inside + "/checkpoint.pt", "", 0});
        (*folder)->onEvent(CheckpointSaved{3.0, 6, inside + "/best/checkpoint.pt", "val_accuracy", 0.75});
        (*folder)->onEvent(CheckpointSaved{4.0, 10, inside + "/checkpoint.pt", "", 0});
        (*folder)->flush();
        const auto summary = readRunSummary((*folder)->path());
        QVERIFY(summary.has_value());
        QCOMPARE((*summary)["checkpoint"]["step"].get<int64_t>(), int64_t{10});
        QCOMPARE((*summary)["checkpoint"]["path"].get<std::string>(), inside + "/checkpoint.pt");
        QCOMPARE((*summary)["best_checkpoint"]["step"].get<int64_t>(), int64_t{6});
        QCOMPARE((*summary)["best_checkpoint"]["value"].get<double>(), 0.75);
        QCOMPARE((*summary)["best_checkpoint"]["metric"].get<std::string>(), std::string("val_accuracy"));
        // The event file keeps which checkpoint was the best model's.
        const std::string events = slurp((*folder)->path() + "/events.jsonl");
        QVERIFY(events.find(R"("metric":"val_accuracy")") != std::string::npos);
    }
}

void TestRunFolder::writesConfigEventsAndSummary() {
    QTemporaryDir dir;
    const std::string folder = recordRun(dir.path().toStdString(), 64, 8, 1'700'000'000);
    // The configuration reads back as the run's options.
    const auto config = loadRunConfig(folder + "/config.json");
    QVERIFY2(config.has_value(), config ? "" : config.error().c_str());
    QCOMPARE(config->targetBatch, int64_t{64});
    // One JSON line per event: the summary, 8 steps, 4 validations, an OOM and the end.
    std::ifstream events(folder + "/events.jsonl");
    int lines = 0;
    for (std::string line; std::getline(events, line);) {
        QVERIFY(nlohmann::json::parse(line, nullptr, false).is_object());
        ++lines;
    }
    QCOMPARE(lines, 1 + 8 + 4 + 1 + 1);
    const auto summary = readRunSummary(folder);
    QVERIFY(summary.has_value());
    const nlohmann::json& s = *summary;
    QCOMPARE(s["state"].get<std::string>(), std::string("finished"));
    QCOMPARE(s["steps"].get<int64_t>(), int64_t{8});
    QCOMPARE(s["samples_seen"].get<int64_t>(), int64_t{512});
    QCOMPARE(s["ooms"].get<int64_t>(), int64_t{1});
    QCOMPARE(s["target_batch"].get<int64_t>(), int64_t{64});
    QCOMPARE(s["model"].get<std::string>(), std::string("mlp"));
    // Accuracy 0.5, 0.8, 0.7, 0.75 at steps 2, 4, 6, 8: best 0.8 at step 4, last 0.75.
    const auto& accuracy = s["metrics"]["val_accuracy"];
    QCOMPARE(accuracy["best"].get<double>(), 0.8);
    QCOMPARE(accuracy["best_step"].get<int64_t>(), int64_t{4});
    QCOMPARE(accuracy["last"].get<double>(), 0.75);
    QCOMPARE(accuracy["count"].get<int64_t>(), int64_t{4});
    // Loss 2/n falls: its best is the last.
    const auto& loss = s["metrics"]["train_loss"];
    QCOMPARE(loss["best"].get<double>(), 0.25);
    QCOMPARE(loss["best_step"].get<int64_t>(), int64_t{8});
    QCOMPARE(s["metrics"]["samples_per_second"]["best"].get<double>(), 1008.0);
    // No temporary file is left behind.
    for (const auto& entry : fs::directory_iterator(folder))
        QVERIFY2(entry.path().filename().string().front() != '.', entry.path().c_str());
}

void TestRunFolder::namesAreNewAndPlain() {
    QTemporaryDir dir;
    TrainerOptions o;
    o.model.name = "/models/My Net (v2).pt";
    o.data.name = "csv";
    const std::time_t when = 1'700'000'000;
    const std::string name = runFolderName(o, when);
    QVERIFY2(QString::fromStdString(name).endsWith(QStringLiteral("-My-Net-v2-csv")), name.c_str());
    // The same second twice: the second run gets its own folder.
    auto a = RunFolder::create(dir.path().toStdString(), o, when);
    auto b = RunFolder::create(dir.path().toStdString(), o, when);
    QVERIFY(a && b);
    QVERIFY((*a)->path() != (*b)->path());
    QVERIFY2(QString::fromStdString((*b)->name()).endsWith(QStringLiteral("-2")), (*b)->name().c_str());
}

void TestRunFolder::listsAndReadsRunsBack() {
    QTemporaryDir dir;
    const std::string runs = dir.path().toStdString();
    const std::string older = recordRun(runs, 64, 8, 1'700'000'000);
    const std::string newer = recordRun(runs, 256, 4, 1'700'000'100);
    fs::create_directory(runs + "/not-a-run");  // no summary: not listed
    const auto listed = listRuns(runs);
    QCOMPARE(listed.size(), std::size_t{2});
    QCOMPARE(listed[0].folder, newer);  // newest first
    QCOMPARE(listed[1].folder, older);
    QVERIFY(listRuns(runs + "/nowhere").empty());
    // The curves, with each x: the 256-sample run's samples seen grow 4x as fast per step.
    const auto curves = readRunCurves(newer);
    QVERIFY(curves.has_value());
    QCOMPARE(curves->trainLoss.size(), std::size_t{4});
    QCOMPARE(curves->trainLoss[1].samplesSeen, int64_t{512});
    QCOMPARE(curves->trainLoss[1].value, 1.0);
    QCOMPARE(curves->valAccuracy.size(), std::size_t{2});
    QCOMPARE(curves->valAccuracy[1].step, int64_t{4});
    QCOMPARE(curves->valAccuracy[1].samplesSeen, int64_t{1024});
    QCOMPARE(curves->valAccuracy[1].value, 0.8);
    // A cut-off last line is skipped and counted; many points are thinned, never all kept.
    {
        std::ofstream out(newer + "/events.jsonl", std::ios::app);
        out << "{\"type\": \"step\", \"loss\": 0.";
    }
    const auto cut = readRunCurves(newer);
    QVERIFY(cut.has_value());
    QCOMPARE(cut->skipped, int64_t{1});
    const std::string many = dir.path().toStdString() + "/many";
    fs::create_directory(many);
    {
        std::ofstream out(many + "/events.jsonl");
        for (int n = 1; n <= 5000; ++n) out << "{\"type\":\"step\",\"step\":" << n << ",\"loss\":1.0}\n";
    }
    const auto thinned = readRunCurves(many, 100);
    QVERIFY(thinned.has_value());
    QVERIFY2(thinned->trainLoss.size() <= 100 && thinned->trainLoss.size() >= 40,
             qPrintable(QString::number(thinned->trainLoss.size())));
    QCOMPARE(thinned->trainLoss.front().step, int64_t{1});
    QVERIFY(!readRunCurves(runs + "/nowhere").has_value());
}

void TestRunFolder::renamesAndDeletesOnlyRuns() {
    QTemporaryDir dir;
    const std::string folder = recordRun(dir.path().toStdString(), 64, 2, 1'700'000'000);
    QVERIFY(renameRun(folder, "batch 64, lr 0.1").has_value());
    QCOMPARE((*readRunSummary(folder))["name"].get<std::string>(), std::string("batch 64, lr 0.1"));
    QVERIFY(!renameRun(folder, "").has_value());
    QVERIFY(!renameRun(folder, std::string(201, 'x')).has_value());
    // A folder holding a file a run does not write is not deleted.
    { std::ofstream(folder + "/notes.txt") << "mine"; }
    const auto refused = deleteRun(folder);
    QVERIFY(!refused.has_value());
    QVERIFY2(refused.error().find("notes.txt") != std::string::npos, refused.error().c_str());
    QVERIFY(fs::exists(folder + "/notes.txt"));
    fs::remove(folder + "/notes.txt");
    QVERIFY(deleteRun(folder).has_value());
    QVERIFY(!fs::exists(folder));
    // Nor is a folder that is no run at all.
    QVERIFY(!deleteRun(dir.path().toStdString()).has_value());
    QVERIFY(fs::exists(dir.path().toStdString()));
}

void TestRunFolder::exportsOneTidyTable() {
    QTemporaryDir dir;
    const std::string folder = recordRun(dir.path().toStdString(), 64, 4, 1'700'000'000);
    {
        std::ofstream out(folder + "/events.jsonl", std::ios::app);
        out << "{\"type\":\"memory\",\"time\":2.5,\"allocated_bytes\":1048576,\"peak_bytes\":2097152}\n";
        out << "not json\n";
    }
    const auto exported = exportRunCsv(folder);
    QVERIFY2(exported.has_value(), exported ? "" : exported.error().c_str());
    QCOMPARE(exported->path, folder + "/series.csv");
    QCOMPARE(exported->skipped, int64_t{1});
    const std::string csv = slurp(folder + "/series.csv");
    QVERIFY(csv.rfind("series,step,samples_seen,time_s,micro_batch,value\n", 0) == 0);
    // Step 2's loss 1.0 at 128 samples; the validation after step 4: accuracy 0.8 at 256 samples;
    // the memory sample with the 4 steps done before it; the OOM with its micro-batch.
    QVERIFY2(csv.find("\ntrain_loss,2,128,1.0000,,1\n") != std::string::npos, csv.c_str());
    QVERIFY2(csv.find("\nval_accuracy,4,256,2.1000,,0.8\n") != std::string::npos, csv.c_str());
    QVERIFY2(csv.find("\nmemory_allocated_bytes,4,256,2.5000,,1048576\n") != std::string::npos, csv.c_str());
    QVERIFY2(csv.find("\noom_requested_bytes,4,256,1.0000,64,1024\n") != std::string::npos, csv.c_str());
    const std::string elsewhere = dir.path().toStdString() + "/table.csv";
    QVERIFY(exportRunCsv(folder, elsewhere).has_value());
    QCOMPARE(slurp(elsewhere), csv);
    QVERIFY(!exportRunCsv(dir.path().toStdString()).has_value());  // not a run folder

    // Every row names a series of exportedSeries() (the list the charts' menus choose from).
    {
        std::istringstream rows(csv);
        std::string row;
        std::getline(rows, row);
        const auto& names = exportedSeries();
        while (std::getline(rows, row)) {
            const std::string name = row.substr(0, row.find(','));
            QVERIFY2(std::find(names.begin(), names.end(), name) != names.end(), row.c_str());
        }
    }
    // One chart's series only (its context menu): exactly the rows of the whole table that name them.
    const std::string lossOnly = dir.path().toStdString() + "/loss.csv";
    const auto partial = exportRunCsv(folder, lossOnly, {"train_loss", "val_accuracy"});
    QVERIFY2(partial.has_value(), partial ? "" : partial.error().c_str());
    std::string expected = "series,step,samples_seen,time_s,micro_batch,value\n";
    int64_t expectedRows = 0;
    std::istringstream whole(csv);
    std::string line;
    std::getline(whole, line);  // the header
    while (std::getline(whole, line)) {
        if (line.rfind("train_loss,", 0) == 0 || line.rfind("val_accuracy,", 0) == 0) {
            expected += line + "\n";
            ++expectedRows;
        }
    }
    QCOMPARE(expectedRows, int64_t{6});  // four steps' losses, validations after steps 2 and 4
    QCOMPARE(partial->rows, expectedRows);
    QCOMPARE(slurp(lossOnly), expected);
}

void TestRunFolder::refusesAFolderItCannotCreate() {
    QTemporaryDir dir;
    const std::string file = dir.path().toStdString() + "/plain";
    { std::ofstream(file) << "x"; }
    TrainerOptions o;
    const auto made = RunFolder::create(file + "/runs", o);
    QVERIFY(!made.has_value());
    QVERIFY2(made.error().find("cannot create the runs folder") != std::string::npos, made.error().c_str());
    QVERIFY(!RunFolder::create("", o).has_value());
}

}  // namespace tst_run_folder

BATCHPILOT_TEST_MAIN(tst_run_folder::TestRunFolder)
#include "tst_run_folder.moc"
