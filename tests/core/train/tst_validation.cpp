// Validation: the held-out split is deterministic and disjoint from training; the metrics equal
// counts and formulas worked out here by hand; the trainer validates on its schedule, its numbers
// equal an evaluation done by this test with the trained model, accuracy rises while training,
// and an out-of-memory error during validation is recovered with the same result.

#include <QtTest>
#include "tests/test_main.h"

#include <QTemporaryDir>

#include <algorithm>
#include <map>
#include <array>
#include <atomic>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "core/device/counting_allocator.h"
#include "core/data/csv_dataset.h"
#include "core/data/dataset.h"
#include "core/nn/model.h"
#include "core/train/trainer.h"
#include "core/train/validation.h"
#include "tests/core/recording_sink.h"

namespace tst_validation {

using namespace batchpilot::core;
using batchpilot::tests::RecordingSink;

namespace {

/// Sample i is the single value i: what a view returns says which base samples it holds.
class NumberedData : public Dataset {
public:
    explicit NumberedData(int64_t n) : m_n(n) {}
    std::string name() const override { return "numbered"; }
    int64_t size() const override { return m_n; }
    std::vector<int64_t> sampleShape() const override { return {1}; }
    int64_t classes() const override { return 2; }
    Batch get(const std::vector<int64_t>& indices) const override {
        Batch b{torch::empty({static_cast<int64_t>(indices.size()), 1}),
                torch::empty({static_cast<int64_t>(indices.size())}, torch::kInt64)};
        for (size_t i = 0; i < indices.size(); ++i) {
            b.inputs[static_cast<int64_t>(i)][0] = static_cast<float>(indices[i]);
            b.targets[static_cast<int64_t>(i)] = indices[i] % 2;
        }
        return b;
    }

private:
    int64_t m_n;
};

/// NumberedData that, once armed, stops the trainer at its next read: in
/// stopDuringTheLastValidation, the final validation pass's first micro-batch.
class StoppingData : public NumberedData {
public:
    using NumberedData::NumberedData;
    Batch get(const std::vector<int64_t>& indices) const override {
        if (Trainer* t = trainer.load(); t != nullptr && armed.exchange(false)) t->stop();
        return NumberedData::get(indices);
    }
    mutable std::atomic<bool> armed{false};
    std::atomic<Trainer*> trainer{nullptr};
};

/// Arms `data` when the run's last step is reported.
class ArmAtLastStep final : public EventSink {
public:
    ArmAtLastStep(StoppingData& data, int64_t lastStep) : m_data(data), m_lastStep(lastStep) {}
    void onEvent(const Event& event) override {
        if (const auto* s = std::get_if<StepMetrics>(&event); s != nullptr && s->step == m_lastStep)
            m_data.armed = true;
        if (std::holds_alternative<ValidationDone>(event)) ++validations;
    }
    int validations = 0;

private:
    StoppingData& m_data;
    int64_t m_lastStep;
};

std::vector<int64_t> valuesOf(const Dataset& data) {
    std::vector<int64_t> all(static_cast<size_t>(data.size()));
    std::iota(all.begin(), all.end(), 0);
    const Batch b = data.get(all);
    std::vector<int64_t> values;
    for (int64_t i = 0; i < b.inputs.size(0); ++i) values.push_back(static_cast<int64_t>(b.inputs[i][0].item<float>()));
    return values;
}

TrainerOptions synthetic(int64_t samples, int64_t steps) {
    TrainerOptions o;
    o.model.name = "mlp";
    o.data.samples = samples;
    o.data.height = o.data.width = 8;
    o.device = "virtual:64MiB";
    o.targetBatch = 64;
    o.steps = steps;
    o.seed = 3;
    o.optimizer.learningRate = 0.05;
    o.intraOpThreads = 1;
    o.probe.objective = ProbeObjective::Largest;  // the same micro-batches in every run
    return o;
}

}  // namespace

class TestValidation : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void heldOutSamplesAreDeterministicAndDisjoint();
    void metricsEqualACountByHand();
    void regressionErrorsByHand();
    void trainerValidatesOnItsSchedule();
    void resultEqualsAnEvaluationOfTheTrainedModel_data();
    void resultEqualsAnEvaluationOfTheTrainedModel();
    void regressionEqualsAnEvaluationOfTheTrainedModel();
    void outOfMemoryDuringValidationIsRecovered();
    void dataFilesHoldOutATenth();
    void splitZeroTurnsItOff();
    void validationTableIsScaledLikeTraining();
    void stopDuringTheLastValidation();
    void aCachingAllocatorGrowsTheValidationMicroBatchAsAnExactOneDoes();
};

// Ctrl-C during the validation at the end of a run drops that pass: the run says it was stopped
// (the CLI then exits 130), not that it is done (issue 39: it printed "interrupted", then "done",
// and exited 0).
void TestValidation::stopDuringTheLastValidation() {
    // 3 steps of 64 of 768 training samples: no epoch ends, the only pass is the run's last.
    TrainerOptions o = synthetic(1024, 3);
    auto data = std::make_shared<StoppingData>(1024);
    o.datasetFactory = [data] { return tl::expected<std::shared_ptr<Dataset>, std::string>(data); };
    o.validation.split = 0.25;
    o.optimizer.learningRate = 1e-6;  // the inputs are the numbers 0..1023
    o.prefetch = Prefetch::Inline;    // every read on the trainer thread, in order
    ArmAtLastStep sink(*data, 3);
    Trainer trainer(o, sink);
    data->trainer = &trainer;
    const RunResult r = trainer.run();
    QVERIFY2(r.state == RunState::Finished, r.error.c_str());
    QCOMPARE(r.steps, int64_t{3});
    QCOMPARE(sink.validations, 0);  // the pass was dropped, not reported
    QVERIFY(r.stopped);
}

void TestValidation::heldOutSamplesAreDeterministicAndDisjoint() {
    QCOMPARE(heldOutCount(1797, 0.1), int64_t{180});
    QCOMPARE(heldOutCount(10, 0.01), int64_t{1});  // a positive share holds out at least one
    QCOMPARE(heldOutCount(3, 0.9), int64_t{2});    // and leaves training at least one
    QCOMPARE(heldOutCount(1, 0.5), int64_t{0});
    QCOMPARE(heldOutCount(100, 0.0), int64_t{0});
    const auto a = heldOutIndices(1000, 0.2, 7);
    QCOMPARE(a, heldOutIndices(1000, 0.2, 7));
    QVERIFY(a != heldOutIndices(1000, 0.2, 8));
    QCOMPARE(a.size(), size_t{200});
    QVERIFY(std::is_sorted(a.begin(), a.end()));
    QCOMPARE(std::set<int64_t>(a.begin(), a.end()).size(), a.size());
    // Spread over the whole data set, not its start: a file sorted by class would otherwise
    // hold out one class.
    QVERIFY(a.front() < 100 && a.back() >= 900);

    auto data = std::make_shared<NumberedData>(50);
    const TrainValidation split = splitHeldOut(data, 0.2, 11);
    QVERIFY(split.validation);
    const auto training = valuesOf(*split.training);
    const auto validation = valuesOf(*split.validation);
    QCOMPARE(training.size(), size_t{40});
    QCOMPARE(validation.size(), size_t{10});
    QVERIFY(std::is_sorted(training.begin(), training.end()));  // the file's order is kept
    std::set<int64_t> all(training.begin(), training.end());
    for (const int64_t v : validation) QVERIFY2(all.insert(v).second, "a held-out sample is also trained on");
    QCOMPARE(all.size(), size_t{50});
    QCOMPARE(validation, heldOutIndices(50, 0.2, 11));
}

void TestValidation::metricsEqualACountByHand() {
    // 4 samples, 7 classes. Sample 0: class 2 is the largest (correct). Sample 1: target 5 is
    // 2nd (top-5, not top-1). Sample 2: target 0 is the smallest of 7 (neither). Sample 3:
    // target 6 is the largest (correct). Top-1: 2 of 4; top-5: 3 of 4.
    const std::vector<std::vector<double>> logits = {{0.1, 0.2, 3.0, 0.0, -1.0, 0.5, 0.3},
                                                     {2.0, 0.0, 0.1, -0.5, 0.2, 1.5, -2.0},
                                                     {-3.0, 1.0, 2.0, 0.5, 0.4, 0.3, 0.2},
                                                     {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0}};
    const std::vector<int64_t> targets = {2, 5, 0, 6};
    // Cross-entropy by hand: log(sum(exp(z))) - z[target], averaged.
    double expected = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
        double sum = 0;
        for (const double z : logits[i]) sum += std::exp(z);
        expected += std::log(sum) - logits[i][static_cast<size_t>(targets[i])];
    }
    expected /= 4.0;
    torch::Tensor output = torch::empty({4, 7});
    for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 7; ++j) output[i][j] = logits[static_cast<size_t>(i)][static_cast<size_t>(j)];
    const torch::Tensor target = torch::tensor(targets, torch::kInt64);
    // Added in two micro-batches of 3 and 1: the same as one pass.
    ValidationTotals totals(LossKind::CrossEntropy);
    totals.add(output.slice(0, 0, 3), target.slice(0, 0, 3));
    totals.add(output.slice(0, 3, 4), target.slice(0, 3, 4));
    QCOMPARE(totals.samples(), int64_t{4});
    QCOMPARE(totals.accuracy(), 0.5);
    QCOMPARE(totals.top5Accuracy(), 0.75);
    QVERIFY2(std::abs(totals.meanLoss() - expected) < 1e-6,
             qPrintable(QStringLiteral("%1 vs %2").arg(totals.meanLoss()).arg(expected)));
    QCOMPARE(totals.meanSquaredError(), -1.0);
    // Five classes or fewer: no top-5 (it would always be 100%).
    ValidationTotals few(LossKind::CrossEntropy);
    few.add(torch::tensor({{1.0F, 0.0F, 0.0F}, {1.0F, 0.0F, 0.0F}}), torch::tensor({0, 2}, torch::kInt64));
    QCOMPARE(few.accuracy(), 0.5);
    QCOMPARE(few.top5Accuracy(), -1.0);
}

void TestValidation::regressionErrorsByHand() {
    // Errors -1, 0.5, 2: squared 1, 0.25, 4 (mean 1.75); absolute 1, 0.5, 2 (mean 7/6).
    ValidationTotals totals(LossKind::Mse);
    totals.add(torch::tensor({{1.0F}, {2.5F}, {5.0F}}), torch::tensor({2.0F, 2.0F, 3.0F}));
    QCOMPARE(totals.accuracy(), -1.0);
    QVERIFY(std::abs(totals.meanSquaredError() - 1.75) < 1e-9);
    QVERIFY(std::abs(totals.meanAbsoluteError() - 7.0 / 6.0) < 1e-9);
    QVERIFY(std::abs(totals.meanLoss() - 1.75) < 1e-6);  // MSE is the loss
}

void TestValidation::trainerValidatesOnItsSchedule() {
    // 512 samples at target 64: 8 steps per epoch. By default once per epoch and at the end.
    RecordingSink byEpoch;
    TrainerOptions o = synthetic(512, 20);
    RunResult result = Trainer(o, byEpoch).run();
    QVERIFY2(result.state == RunState::Finished, result.error.c_str());
    std::vector<int64_t> steps;
    for (const ValidationDone& v : byEpoch.all<ValidationDone>()) steps.push_back(v.step);
    QCOMPARE(steps, (std::vector<int64_t>{8, 16, 20}));
    // Synthetic data holds out a tenth of extra samples of its own: training keeps all 512.
    QCOMPARE(byEpoch.all<RunSummary>().front().datasetSize, int64_t{512});
    QCOMPARE(byEpoch.all<ValidationDone>().front().samples, int64_t{51});

    RecordingSink every;
    o.validation.everySteps = 6;
    result = Trainer(o, every).run();
    QVERIFY2(result.state == RunState::Finished, result.error.c_str());
    steps.clear();
    for (const ValidationDone& v : every.all<ValidationDone>()) steps.push_back(v.step);
    QCOMPARE(steps, (std::vector<int64_t>{6, 12, 18, 20}));
    // Accuracy rises while the model learns (10 classes: 10% is chance).
    const auto v = every.all<ValidationDone>();
    qInfo("validation accuracy %.3f -> %.3f, loss %.4f -> %.4f", v.front().accuracy, v.back().accuracy, v.front().loss,
          v.back().loss);
    QVERIFY(v.back().accuracy > v.front().accuracy);
    QVERIFY(v.back().loss < v.front().loss);
    QVERIFY(v.back().top5Accuracy >= v.back().accuracy);
    QCOMPARE(v.back().samplesSeen, int64_t{20 * 64});
}

void TestValidation::resultEqualsAnEvaluationOfTheTrainedModel_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<int>("norm");
    QTest::addColumn<qint64>("classes");
    QTest::newRow("mlp, 10 classes") << QStringLiteral("mlp") << int(NormKind::Group) << qint64{10};
    // BatchNorm: evaluated in eval mode, with the running statistics training left (batch
    // statistics of a validation micro-batch would give other numbers).
    QTest::newRow("resnet with BatchNorm, 12 classes")
        << QStringLiteral("resnet") << int(NormKind::Batch) << qint64{12};
    QTest::newRow("cnn, 40 classes") << QStringLiteral("cnn") << int(NormKind::Group) << qint64{40};
}

void TestValidation::resultEqualsAnEvaluationOfTheTrainedModel() {
    // The last validation against the test's own evaluation of the trained model on the held-out
    // samples (the generator's samples 300..329), in one pass, with its own argmax, top-5 count
    // (a sort of each row) and cross-entropy (log-sum-exp minus the target's logit).
    QFETCH(QString, model);
    QFETCH(int, norm);
    QFETCH(qint64, classes);
    RecordingSink sink;
    TrainerOptions o = synthetic(300, 12);
    o.model.name = model.toStdString();
    o.model.norm = static_cast<NormKind>(norm);
    o.data.classes = classes;
    o.validation.everySteps = 12;
    // Training in micro-batches of at most 8, validation in pieces too: they must add up to the
    // test's one pass.
    o.probe.maxMicroBatch = 8;
    Trainer trainer(o, sink);
    const RunResult result = trainer.run();
    QVERIFY2(result.state == RunState::Finished, result.error.c_str());
    const auto done = sink.all<ValidationDone>();
    QCOMPARE(done.size(), size_t{1});
    DataOptions bigger = o.data;
    bigger.samples = 330;
    SyntheticImages generator(bigger);
    std::vector<int64_t> held(30);
    std::iota(held.begin(), held.end(), 300);
    const Batch batch = generator.get(held);
    torch::NoGradGuard noGrad;
    trainer.model()->train(false);
    const torch::Tensor logits = trainer.model()->forward(batch.inputs).to(torch::kFloat64);
    int64_t correct = 0;
    int64_t correct5 = 0;
    double loss = 0;
    for (int64_t i = 0; i < 30; ++i) {
        std::vector<std::pair<double, int64_t>> row;
        for (int64_t c = 0; c < classes; ++c) row.emplace_back(logits[i][c].item<double>(), c);
        std::sort(row.begin(), row.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        const int64_t target = batch.targets[i].item<int64_t>();
        if (row[0].second == target) ++correct;
        for (int k = 0; k < 5; ++k)
            if (row[size_t(k)].second == target) ++correct5;
        double sum = 0;
        for (const auto& [z, c] : row) sum += std::exp(z);
        loss += std::log(sum) - logits[i][target].item<double>();
    }
    qInfo("%s: validation loss %.6f (here %.6f), accuracy %.4f (%.4f), top-5 %.4f (%.4f)", qPrintable(model),
          done.front().loss, loss / 30.0, done.front().accuracy, double(correct) / 30.0, done.front().top5Accuracy,
          double(correct5) / 30.0);
    QCOMPARE(done.front().samples, int64_t{30});
    QVERIFY2(done.front().microBatch < 30, qPrintable(QString::number(done.front().microBatch)));
    QCOMPARE(done.front().accuracy, static_cast<double>(correct) / 30.0);
    QCOMPARE(done.front().top5Accuracy, static_cast<double>(correct5) / 30.0);
    QVERIFY2(std::abs(done.front().loss - loss / 30.0) < 1e-5,
             qPrintable(QStringLiteral("%1 vs %2").arg(done.front().loss).arg(loss / 30.0)));
    QCOMPARE(done.front().meanSquaredError, -1.0);
}

void TestValidation::regressionEqualsAnEvaluationOfTheTrainedModel() {
    // A regression table (y = x1 - 2·x2 + noise) with MSE, validated on a second file: the pass's
    // MSE, MAE and loss against the test's own evaluation of the trained model on that file's
    // rows, as written here.
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    std::mt19937 random(11);
    std::normal_distribution<double> normal(0.0, 1.0);
    // Each number as the file holds it (6 significant digits), so that the test reads what the
    // trainer reads.
    const auto asWritten = [](double v) {
        std::ostringstream text;
        text << v;
        return std::stod(text.str());
    };
    const auto write = [&](const QString& name, int rows) {
        std::vector<std::array<double, 3>> kept;
        std::ofstream out(dir.filePath(name).toStdString());
        out << "x1,x2,y\n";
        for (int i = 0; i < rows; ++i) {
            const double x1 = asWritten(3 * normal(random) + 5);
            const double x2 = asWritten(normal(random));
            const double y = asWritten(x1 - 2 * x2 + 0.1 * normal(random));
            out << x1 << ',' << x2 << ',' << y << '\n';
            kept.push_back({x1, x2, y});
        }
        return kept;
    };
    const auto training = write(QStringLiteral("train.csv"), 256);
    const auto heldOut = write(QStringLiteral("val.csv"), 37);
    TrainerOptions o = synthetic(256, 16);
    o.data.name = "csv";
    o.data.path = dir.filePath(QStringLiteral("train.csv")).toStdString();
    o.data.targetColumn = "y";
    o.data.regression = true;
    o.loss = LossKind::Mse;
    o.validation.path = dir.filePath(QStringLiteral("val.csv")).toStdString();
    o.targetBatch = 32;
    RecordingSink sink;
    Trainer trainer(o, sink);
    const RunResult result = trainer.run();
    QVERIFY2(result.state == RunState::Finished, result.error.c_str());
    const auto done = sink.all<ValidationDone>();
    QVERIFY(!done.empty());
    const ValidationDone& last = done.back();
    QCOMPARE(last.step, int64_t{16});

    // The features standardised with the training file's mean and (population) deviation, as the
    // guide says the validation file is.
    double mean[2] = {0, 0};
    double deviation[2] = {0, 0};
    for (const auto& row : training)
        for (int j = 0; j < 2; ++j) mean[j] += row[size_t(j)] / 256;
    for (const auto& row : training)
        for (int j = 0; j < 2; ++j) deviation[j] += (row[size_t(j)] - mean[j]) * (row[size_t(j)] - mean[j]) / 256;
    torch::NoGradGuard noGrad;
    trainer.model()->train(false);
    torch::Tensor inputs = torch::empty({37, 2});
    for (int i = 0; i < 37; ++i)
        for (int j = 0; j < 2; ++j) inputs[i][j] = (heldOut[size_t(i)][size_t(j)] - mean[j]) / std::sqrt(deviation[j]);
    const torch::Tensor output = trainer.model()->forward(inputs).to(torch::kFloat64).reshape({37});
    double squared = 0;
    double absolute = 0;
    for (int i = 0; i < 37; ++i) {
        const double error = output[i].item<double>() - double(float(heldOut[size_t(i)][2]));
        squared += error * error;
        absolute += std::abs(error);
    }
    qInfo("regression: validation MSE %.6f (here %.6f), MAE %.6f (here %.6f)", last.meanSquaredError, squared / 37,
          last.meanAbsoluteError, absolute / 37);
    QCOMPARE(last.samples, int64_t{37});
    QCOMPARE(last.accuracy, -1.0);
    QVERIFY2(std::abs(last.meanSquaredError - squared / 37) < 1e-5 * std::max(1.0, squared / 37),
             qPrintable(QStringLiteral("MSE %1 vs %2").arg(last.meanSquaredError).arg(squared / 37)));
    QVERIFY2(std::abs(last.meanAbsoluteError - absolute / 37) < 1e-5 * std::max(1.0, absolute / 37),
             qPrintable(QStringLiteral("MAE %1 vs %2").arg(last.meanAbsoluteError).arg(absolute / 37)));
    QVERIFY2(std::abs(last.loss - squared / 37) < 1e-5 * std::max(1.0, squared / 37),
             qPrintable(QStringLiteral("loss %1 vs %2").arg(last.loss).arg(squared / 37)));
    // It learned the line, so the numbers compared are not those of an untrained model.
    QVERIFY2(
        last.meanSquaredError < done.front().meanSquaredError || done.size() == 1,
        qPrintable(QStringLiteral("MSE %1 after %2").arg(last.meanSquaredError).arg(done.front().meanSquaredError)));
}

void TestValidation::outOfMemoryDuringValidationIsRecovered() {
    // The first allocation of the validation after step 4 fails: the pass halves its micro-batch,
    // says so, and reports what a run without the failure reports.
    TrainerOptions o = synthetic(512, 8);
    o.validation.everySteps = 4;
    RecordingSink clean;
    QVERIFY(Trainer(o, clean).run().state == RunState::Finished);
    RecordingSink faulty;
    faulty.onEach = [](const Event& e) {
        const auto* b = std::get_if<MemoryBreakdown>(&e);
        if (b && b->step == 4) CountingAllocator::instance().failAfter(1);
    };
    const RunResult result = Trainer(o, faulty).run();
    CountingAllocator::instance().failAfter(0);
    QVERIFY2(result.state == RunState::Finished, result.error.c_str());
    std::vector<OomEvent> ooms;
    for (const OomEvent& oom : faulty.all<OomEvent>())
        if (oom.phase == Phase::Validation) ooms.push_back(oom);
    QCOMPARE(ooms.size(), size_t{1});
    QVERIFY(ooms.front().recovered);
    QCOMPARE(ooms.front().newMicroBatch, ooms.front().microBatch / 2);
    const auto a = clean.all<ValidationDone>();
    const auto b = faulty.all<ValidationDone>();
    QCOMPARE(a.size(), size_t{2});
    QCOMPARE(b.size(), size_t{2});
    QCOMPARE(b.front().ooms, 1);
    QCOMPARE(a.front().ooms, 0);
    QVERIFY(b.front().microBatch < a.front().microBatch);
    for (size_t i = 0; i < 2; ++i) {
        QCOMPARE(b[i].samples, a[i].samples);
        QCOMPARE(b[i].accuracy, a[i].accuracy);
        QVERIFY(std::abs(b[i].loss - a[i].loss) < 1e-5 * std::max(1.0, a[i].loss));
    }
    // Training did not notice: the same losses step by step.
    const auto la = clean.all<StepMetrics>();
    const auto lb = faulty.all<StepMetrics>();
    QCOMPARE(la.size(), lb.size());
    for (size_t i = 0; i < la.size(); ++i) QCOMPARE(la[i].loss, lb[i].loss);
}

void TestValidation::dataFilesHoldOutATenth() {
    // A CSV of 200 rows: 20 held out by default, the other 180 trained on.
    QTemporaryDir dir;
    const std::string path = dir.filePath(QStringLiteral("table.csv")).toStdString();
    {
        std::ofstream out(path);
        out << "x,y,label\n";
        for (int i = 0; i < 200; ++i) out << i % 7 << "," << (i * 3) % 11 << "," << i % 3 << "\n";
    }
    TrainerOptions o = synthetic(4096, 6);
    o.data.name = "csv";
    o.data.path = path;
    o.data.targetColumn = "label";
    o.targetBatch = 32;
    RecordingSink sink;
    const RunResult result = Trainer(o, sink).run();
    QVERIFY2(result.state == RunState::Finished, result.error.c_str());
    QCOMPARE(sink.all<RunSummary>().front().datasetSize, int64_t{180});
    const auto done = sink.all<ValidationDone>();
    QVERIFY(!done.empty());
    QCOMPARE(done.back().samples, int64_t{20});
    QVERIFY(done.back().accuracy >= 0);
    QCOMPARE(done.back().top5Accuracy, -1.0);  // 3 classes
    // A separate validation file in the same format is evaluated whole instead.
    o.validation.path = path;
    RecordingSink second;
    QVERIFY(Trainer(o, second).run().state == RunState::Finished);
    QCOMPARE(second.all<RunSummary>().front().datasetSize, int64_t{200});
    QCOMPARE(second.all<ValidationDone>().back().samples, int64_t{200});
    // One whose columns differ is refused before training, with both shapes.
    const std::string other = dir.filePath(QStringLiteral("other.csv")).toStdString();
    {
        std::ofstream out(other);
        out << "x,label\n1,0\n2,1\n";
    }
    o.validation.path = other;
    RecordingSink refused;
    const RunResult bad = Trainer(o, refused).run();
    QCOMPARE(bad.state, RunState::Failed);
    QVERIFY(bad.badInput);
    QVERIFY2(bad.error.find("shape 1") != std::string::npos && bad.error.find("training data 2") != std::string::npos,
             bad.error.c_str());
    QVERIFY(refused.all<StepMetrics>().empty());
}

void TestValidation::splitZeroTurnsItOff() {
    TrainerOptions o = synthetic(256, 8);
    o.validation.split = 0.0;
    RecordingSink sink;
    QVERIFY(Trainer(o, sink).run().state == RunState::Finished);
    QVERIFY(sink.all<ValidationDone>().empty());
    // Data given by a factory (tests, embedding code) is not split unless asked.
    TrainerOptions f = synthetic(256, 8);
    f.datasetFactory = [] {
        return tl::expected<std::shared_ptr<Dataset>, std::string>(std::make_shared<NumberedData>(256));
    };
    f.optimizer.learningRate = 1e-5;  // the inputs are the numbers 0..255
    RecordingSink factory;
    const RunResult r = Trainer(f, factory).run();
    QVERIFY2(r.state == RunState::Finished, r.error.c_str());
    QVERIFY(factory.all<ValidationDone>().empty());
    QCOMPARE(factory.all<RunSummary>().front().datasetSize, int64_t{256});
}

void TestValidation::validationTableIsScaledLikeTraining() {
    // CSV features are standardised over their file. A validation file holding the training
    // file's first 20 rows must give those rows' training inputs, not inputs standardised over
    // its own 20 rows (whose mean and spread differ).
    QTemporaryDir dir;
    const std::string trainPath = dir.filePath(QStringLiteral("train.csv")).toStdString();
    const std::string validPath = dir.filePath(QStringLiteral("valid.csv")).toStdString();
    {
        std::ofstream train(trainPath), valid(validPath);
        train << "height,weight,label\n";
        valid << "height,weight,label\n";
        for (int i = 0; i < 100; ++i) {
            const std::string row =
                std::to_string(150 + i) + "," + std::to_string(40 + (i * 7) % 50) + "," + std::to_string(i % 2) + "\n";
            train << row;
            if (i < 20) valid << row;
        }
    }
    TrainerOptions o;
    o.data.name = "csv";
    o.data.path = trainPath;
    o.data.targetColumn = "label";
    o.validation.path = validPath;
    auto training = makeDataset(o.data);
    QVERIFY(training.has_value());
    auto made = makeValidation(o, *training);
    QVERIFY2(made.has_value(), made ? "" : made.error().c_str());
    std::vector<int64_t> first(20);
    std::iota(first.begin(), first.end(), 0);
    const Batch expected = (*training)->get(first);
    const Batch got = made->validation->get(first);
    QVERIFY2(
        torch::allclose(got.inputs, expected.inputs, 1e-5, 1e-5),
        qPrintable(QStringLiteral("max difference %1").arg((got.inputs - expected.inputs).abs().max().item<double>())));
    QVERIFY(torch::equal(got.targets, expected.targets));
    // Standardised over its own rows they would differ by far more than rounding.
    auto own = makeDataset(DataOptions{.name = "csv", .path = validPath, .targetColumn = "label"});
    QVERIFY(own.has_value());
    QVERIFY((*own)->get(first).inputs.sub(expected.inputs).abs().max().item<double>() > 0.5);
    // Columns by another name are refused, naming both sets.
    const std::string renamed = dir.filePath(QStringLiteral("renamed.csv")).toStdString();
    {
        std::ofstream out(renamed);
        out << "height,mass,label\n1,2,0\n3,4,1\n";
    }
    o.validation.path = renamed;
    auto refused = makeValidation(o, *training);
    QVERIFY(!refused.has_value());
    QVERIFY2(refused.error().find("height, mass") != std::string::npos &&
                 refused.error().find("height, weight") != std::string::npos,
             refused.error().c_str());
}

void TestValidation::aCachingAllocatorGrowsTheValidationMicroBatchAsAnExactOneDoes() {
    // Validation keeps no activation for backward, so its micro-batch doubles while one would still
    // fit twice. Under a caching allocator (the default virtual GPU, CUDA) the cache training left
    // must not count as the pass's own memory: the same run on the same budget counted exactly
    // (no cache) is the reference, pass by pass. Before, the caching run stopped one doubling short
    // on the cnn (32 against 64), and with a cache filling the memory never grew at all.
    for (const char* budget : {"24MiB", "64MiB"}) {
        std::map<std::string, std::vector<ValidationDone>> passes;
        for (const std::string suffix : {"", "/exact"}) {
            TrainerOptions o = synthetic(4096, 4);
            o.model.name = "cnn";
            o.data.height = o.data.width = 32;
            o.targetBatch = 256;
            o.device = std::string("virtual:") + budget + suffix;
            o.probe.maxMicroBatch = 16;  // the same training micro-batch on both
            o.validation.everySteps = 2;
            RecordingSink sink;
            const RunResult result = Trainer(o, sink).run();
            QVERIFY2(result.state == RunState::Finished, result.error.c_str());
            for (const OomEvent& oom : sink.all<OomEvent>()) QVERIFY(oom.phase != Phase::Validation);
            passes[suffix] = sink.all<ValidationDone>();
        }
        const auto& caching = passes[""];
        const auto& exact = passes["/exact"];
        QCOMPARE(caching.size(), size_t{2});
        QCOMPARE(exact.size(), caching.size());
        for (size_t i = 0; i < caching.size(); ++i) {
            QVERIFY2(caching[i].microBatch == exact[i].microBatch,
                     qPrintable(QStringLiteral("%1, pass %2: %3 (caching) vs %4 (exact)")
                                    .arg(QLatin1String(budget))
                                    .arg(i + 1)
                                    .arg(caching[i].microBatch)
                                    .arg(exact[i].microBatch)));
            QVERIFY(caching[i].microBatch > 16);  // it grew beyond training's
        }
    }
}

}  // namespace tst_validation

BATCHPILOT_TEST_MAIN(tst_validation::TestValidation)
#include "tst_validation.moc"
