// The memory-saver survey's arithmetic (core/plan/saver_survey.h) against synthetic memory lines:
// which sizes it runs, what it predicts, and which saver it suggests. The trainer's side (real
// models, predictions against the probe) is in tst_memory_savers.cpp.

#include <QtTest>
#include "tests/test_main.h"

#include <functional>

#include "core/plan/saver_survey.h"

namespace tst_saver_survey {

using namespace batchpilot::core;

namespace {

constexpr int64_t MiB = int64_t{1} << 20;

/// Runs the survey's size sequence against a device where a micro-batch of n samples peaks at
/// `peak(n)` bytes and runs out of memory above `capacity`; each run takes n / `speed` seconds.
std::vector<SaverTrial> survey(const std::function<int64_t(int64_t)>& peak, int64_t capacity, int64_t usable,
                               int64_t upper, int64_t smallest = 1, double speed = 100) {
    std::vector<SaverTrial> trials;
    while (const std::optional<int64_t> size = nextSurveySize(trials, usable, upper, smallest)) {
        const int64_t p = peak(*size);
        const bool fit = p <= capacity;
        // Out of memory, the trainer knows at least what the failed allocation would have reached.
        trials.push_back({*size, fit, p, static_cast<double>(*size) / speed});
        if (trials.size() > 10) break;  // the survey promises at most five sizes
    }
    return trials;
}

SaverOption option(const std::string& savers, bool fits, double samplesPerSecond, int64_t microBatch = 8) {
    SaverOption o;
    o.savers = savers;
    o.fits = fits;
    o.samplesPerSecond = samplesPerSecond;
    o.microBatch = microBatch;
    return o;
}

}  // namespace

class TestSaverSurvey : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void straightLineIsPredictedExactlyInThreeSizes();
    void predictionThatRunsOverIsCorrected();
    void nothingFitsAtTheSmallestSize();
    void upperBoundCapsThePrediction();
    void throughputIsTimedAtTheLargestSizeThatFit();
    void suggestionIsTheFastestThatFits();
    void adviceSaysWhatEachSaverDoes();
};

void TestSaverSurvey::straightLineIsPredictedExactlyInThreeSizes() {
    // 10 MiB fixed + 1 MiB per sample, 50 MiB usable: 40 samples fit, 41 do not.
    const auto line = [](int64_t n) { return 10 * MiB + n * MiB; };
    const std::vector<SaverTrial> trials = survey(line, 64 * MiB, 50 * MiB, 1024);
    QCOMPARE(trials.size(), size_t{3});
    QCOMPARE(trials[0].microBatch, int64_t{1});
    QCOMPARE(trials[1].microBatch, int64_t{8});
    QCOMPARE(trials[2].microBatch, int64_t{40});
    const SaverOption o = predictSaver("checkpoint", trials, 50 * MiB, 1024, 256, 1);
    QVERIFY(o.fits);
    QCOMPARE(o.savers, std::string("checkpoint"));
    QCOMPARE(o.microBatch, int64_t{40});
    QCOMPARE(o.accumulationSteps, int64_t{7});  // ceil(256 / 40)
    QCOMPARE(o.peakBytes, 50 * MiB);
    QCOMPARE(qRound64(o.fixedBytes), 10 * MiB);
    QCOMPARE(qRound64(o.bytesPerSample), MiB);
    QCOMPARE(o.trials, int64_t{3});
}

void TestSaverSurvey::predictionThatRunsOverIsCorrected() {
    // Small sizes need less per sample than large ones (a 20 MiB workspace from 16 samples on):
    // the line through 1 and 8 promises 48, which runs out of memory; the line between 8 and
    // 48 promises 34, out of memory again; after two misses the bracket is halved (21, fits),
    // and the line between 21 and 34 finds 28, the true limit (2 + 28 + 20 = 50 MiB).
    const auto curved = [](int64_t n) { return 2 * MiB + n * MiB + (n >= 16 ? 20 * MiB : 0); };
    const std::vector<SaverTrial> trials = survey(curved, 52 * MiB, 50 * MiB, 1024);
    QVERIFY2(trials.size() <= kMaxSurveySizes, qPrintable(QString::number(trials.size())));
    QCOMPARE(trials[2].microBatch, int64_t{48});
    QVERIFY(!trials[2].fit);
    const SaverOption o = predictSaver("off", trials, 50 * MiB, 1024, 256, 1);
    QCOMPARE(o.microBatch, int64_t{28});
    QCOMPARE(o.timedMicroBatch, int64_t{28});
    // Never at or above a size that failed, never below one that fit within the usable memory.
    for (const SaverTrial& t : trials) {
        if (t.fit && t.peakBytes <= 50 * MiB) QVERIFY(o.microBatch >= t.microBatch);
        if (!t.fit) QVERIFY(o.microBatch < t.microBatch);
    }
}

void TestSaverSurvey::nothingFitsAtTheSmallestSize() {
    const auto big = [](int64_t n) { return 100 * MiB + n * MiB; };
    const std::vector<SaverTrial> trials = survey(big, 64 * MiB, 60 * MiB, 1024);
    QCOMPARE(trials.size(), size_t{1});
    const SaverOption o = predictSaver("bf16", trials, 60 * MiB, 1024, 256, 1);
    QVERIFY(!o.fits);
    QCOMPARE(o.microBatch, int64_t{0});
    // Fits the device but not the usable part (the headroom line): does not fit either.
    const std::vector<SaverTrial> over = survey(big, 256 * MiB, 60 * MiB, 1024);
    QCOMPARE(over.size(), size_t{1});
    QVERIFY(!predictSaver("bf16", over, 60 * MiB, 1024, 256, 1).fits);
}

void TestSaverSurvey::upperBoundCapsThePrediction() {
    // Everything fits up to the target batch: the prediction is the target, one micro-batch.
    const auto small = [](int64_t n) { return MiB + n * 1024; };
    const std::vector<SaverTrial> trials = survey(small, 64 * MiB, 60 * MiB, 32);
    QVERIFY(trials.size() <= 3);
    QCOMPARE(trials.back().microBatch, int64_t{32});
    const SaverOption o = predictSaver("off", trials, 60 * MiB, 32, 32, 1);
    QCOMPARE(o.microBatch, int64_t{32});
    QCOMPARE(o.accumulationSteps, int64_t{1});
    // An upper bound equal to the smallest size: one size, nothing to predict.
    QCOMPARE(survey(small, 64 * MiB, 60 * MiB, 2, 2).size(), size_t{1});
    // BatchNorm models start at 2: the second size is 16.
    const std::vector<SaverTrial> pairs = survey(small, 64 * MiB, 60 * MiB, 1024, 2);
    QCOMPARE(pairs[0].microBatch, int64_t{2});
    QCOMPARE(pairs[1].microBatch, kSecondSize * 2);
}

void TestSaverSurvey::throughputIsTimedAtTheLargestSizeThatFit() {
    const auto line = [](int64_t n) { return 10 * MiB + n * MiB; };
    std::vector<SaverTrial> trials = survey(line, 64 * MiB, 50 * MiB, 1024, 1, 200);
    // The trainer runs the timed size once more (warm kernels): the faster run counts.
    trials.push_back({40, true, 50 * MiB, 0.1});
    const SaverOption o = predictSaver("off", trials, 50 * MiB, 1024, 256, 1);
    QCOMPARE(o.timedMicroBatch, int64_t{40});
    QCOMPARE(o.samplesPerSecond, 400.0);  // 40 samples in 0.1 s, not the first run's 0.2 s
}

void TestSaverSurvey::suggestionIsTheFastestThatFits() {
    // The current savers fit: another one is suggested only when more than 5% faster.
    std::vector<SaverOption> options = {option("off", true, 100), option("checkpoint", true, 104),
                                        option("bf16", true, 90), option("both", true, 80)};
    QCOMPARE(suggestSaver(options, "off"), std::optional<size_t>());
    options[1].samplesPerSecond = 106;
    QCOMPARE(suggestSaver(options, "off"), std::optional<size_t>(1));
    // The fastest is in use: nothing to suggest.
    QCOMPARE(suggestSaver(options, "checkpoint"), std::optional<size_t>());
    // The current savers do not fit: the fastest that does, however slow.
    options[0].fits = false;
    options[1].fits = false;
    QCOMPARE(suggestSaver(options, "off"), std::optional<size_t>(2));
    // Not available (a model that cannot be split) is never suggested.
    options[2].unavailable = "its forward is one function";
    QCOMPARE(suggestSaver(options, "off"), std::optional<size_t>(3));
    options[3].fits = false;
    QCOMPARE(suggestSaver(options, "off"), std::optional<size_t>());
}

void TestSaverSurvey::adviceSaysWhatEachSaverDoes() {
    SaverSurvey s;
    s.current = "off";
    s.options = {option("off", true, 100, 6), option("checkpoint", true, 74, 23), option("bf16", false, 0),
                 option("both", true, 50, 31)};
    s.options[2].unavailable = "it failed: BFloat16";
    const std::string keep = saverAdvice(s);
    QVERIFY2(keep.find("no memory saver (in use): micro-batch 6, 100 samples/s") != std::string::npos, keep.c_str());
    QVERIFY2(keep.find("activation checkpointing: micro-batch 6 → 23, 0.74× samples/s") != std::string::npos,
             keep.c_str());
    QVERIFY2(keep.find("bfloat16 autocast: not available (it failed: BFloat16)") != std::string::npos, keep.c_str());
    QVERIFY2(keep.find("keep no memory saver") != std::string::npos, keep.c_str());
    s.suggestion = "checkpoint";
    QVERIFY(saverAdvice(s).find("suggested: activation checkpointing") != std::string::npos);
    s.options[0].fits = false;
    s.options[1].fits = false;
    s.options[3].fits = false;
    QVERIFY(saverAdvice(s).find("nothing fits") != std::string::npos);
}

}  // namespace tst_saver_survey

BATCHPILOT_TEST_MAIN(tst_saver_survey::TestSaverSurvey)
#include "tst_saver_survey.moc"
