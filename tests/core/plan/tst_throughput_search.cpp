// The fastest-micro-batch search on synthetic throughput curves: each case states the curve, and
// the expected choice is the best point of an exhaustive look at that curve (or, within noise,
// the largest), computed here independently of the search.

#include <QtTest>
#include "tests/test_main.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "core/plan/throughput_search.h"

namespace tst_throughput_search {

using namespace batchpilot::core;

namespace {

/// Samples per second at micro-batch n, as a device would measure it without noise.
using Curve = std::function<double(int64_t)>;

/// Deterministic multiplicative noise in [1 - amplitude, 1 + amplitude].
struct Noise {
    double amplitude = 0;
    uint64_t state = 12345;
    double factor() {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        const double unit = static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53);  // [0, 1)
        return 1 + amplitude * (2 * unit - 1);
    }
};

struct Outcome {
    int64_t chosen = 0;
    int spent = 0;
    double overLargest = 0;  ///< the chosen size's speed over the largest, as the search measured it
    std::string reason;
    std::map<int64_t, int> timed;    ///< micro-batches run per size (warm-ups included)
    std::map<int64_t, int> counted;  ///< counted timings per size
};

/// The machine's speed, as a factor of its usual one, after `elapsed` seconds of the search.
using Drift = std::function<double(double elapsed)>;

/// Runs the search to its end: each micro-batch takes n / (curve(n) · noise · drift) seconds; the
/// first one of every size is `warmupPenalty` times slower (caches, kernels being picked).
Outcome run(ThroughputSearchOptions options, const Curve& curve, double noise = 0, double warmupPenalty = 1,
            const Drift& drift = {}) {
    ThroughputSearch search(options);
    Noise jitter{noise};
    Outcome out;
    int guard = 0;
    double elapsed = 0;
    while (auto size = search.next()) {
        const bool first = out.timed[*size]++ == 0;
        const double speed = curve(*size) * jitter.factor() * (drift ? drift(elapsed) : 1.0);
        const double seconds = static_cast<double>(*size) / speed * (first ? warmupPenalty : 1.0);
        elapsed += seconds;
        search.record(*size, seconds);
        if (++guard > 5000) break;
    }
    out.chosen = search.chosen();
    out.overLargest = search.overLargest(out.chosen);
    out.spent = search.timings();
    for (const ThroughputSearch::Candidate& c : search.candidates())
        out.counted[c.microBatch] = static_cast<int>(c.samplesPerSecond.size());
    out.reason = search.reason();
    return out;
}

/// The best candidate of the curve without noise (ties to the larger), the reference.
int64_t bestOf(const std::vector<int64_t>& candidates, const Curve& curve) {
    int64_t best = candidates.front();
    for (int64_t size : candidates)
        if (curve(size) > curve(best)) best = size;
    return best;
}

/// A curve through measured points, straight in log-log between them (sizes between two
/// halvings get a rate between theirs).
Curve through(std::map<int64_t, double> points) {
    return [points](int64_t n) {
        auto above = points.lower_bound(n);
        if (above == points.end()) return std::prev(above)->second;
        if (above->first == n || above == points.begin()) return above->second;
        const auto below = std::prev(above);
        const double t =
            std::log(double(n) / double(below->first)) / std::log(double(above->first) / double(below->first));
        return std::exp(std::log(below->second) + t * (std::log(above->second) - std::log(below->second)));
    };
}

ThroughputSearchOptions options(int64_t largest, int64_t target) {
    ThroughputSearchOptions o;
    o.largest = largest;
    o.target = target;
    return o;
}

}  // namespace

class TestThroughputSearch : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void candidatesSplitTheTargetEvenly();
    void plateauKeepsTheLargest();
    void peakThenFallFindsThePeak();
    void flatWithinNoiseKeepsTheLargest();
    void warmupsAreNotCounted();
    void budgetEndsTheSearch();
    void clearDifferenceNeedsTwoTurns();
    void refinesBetweenHalvings();
    void driftSlowsBothSidesAlike();
    void oneCandidateTimesNothing();
    void shortMicroBatchesAreTimedTogether();
    void abandonKeepsTheBestSoFar();
    void clearlySlowerEndsTheWalk();
    void startsFromTheChoiceBefore();
    void startBelowTheOptimumWalksUp();
    void startIsRoundedToAnEvenSplit();
    void driftWatchActsOnLastingChanges();
    void stepGainCountsWhatBatchesCostBesides();
    void stepCostsAreMediansOfCleanBatches();
    void theGainIsTimedAgainstTheLargestOnceMore();
    void comparisonsCutShortSayWhatTheyClaim();
    void everyWarmupIsLeftOut();
    void aClockWithoutTimeEndsTheSearch();
    void batchCheckSpreadsItsTurnsOverTheSpan();
    void medianIntervalCoversTheMedianNineteenTimesInTwenty();
    void batchCheckGoesOnUntilTheGainIsKnown();
};

void TestThroughputSearch::candidatesSplitTheTargetEvenly() {
    // 271 fits, target 1024: 4 micro-batches of 256 is what 271 runs anyway; then halvings.
    QCOMPARE(throughputCandidates(271, 1024, 1, 1), (std::vector<int64_t>{256, 128, 64, 32, 16, 8, 4, 2, 1}));
    // 300 fits, target 1000: ceil(1000/4) = 250, then 150 → 7 parts of 143, 75 → 14 parts of 72 …
    const std::vector<int64_t> sizes = throughputCandidates(300, 1000, 1, 1);
    QCOMPARE(sizes.front(), int64_t(250));
    for (size_t i = 0; i < sizes.size(); ++i) {
        const int64_t n = sizes[i];
        const int64_t parts = (1000 + n - 1) / n;
        QVERIFY2(parts * n - 1000 < parts, "every candidate splits the target into near-equal parts");
        if (i > 0) QVERIFY(n < sizes[i - 1]);
    }
    // Multiples of 8 where possible; no candidate under the model's smallest micro-batch.
    for (int64_t n : throughputCandidates(300, 1000, 8, 2)) {
        QVERIFY(n >= 2);
        if (n >= 8) QCOMPARE(n % 8, int64_t(0));
    }
    QCOMPARE(throughputCandidates(64, 64, 1, 64), (std::vector<int64_t>{64}));
}

void TestThroughputSearch::plateauKeepsTheLargest() {
    // A GPU-like curve: throughput rises until 256 and is flat above it.
    const Curve plateau = [](int64_t n) { return 9000.0 * static_cast<double>(std::min<int64_t>(n, 256)) / 256; };
    const Outcome out = run(options(1024, 4096), plateau, 0.01);
    QCOMPARE(out.chosen, int64_t(1024));  // 512 and 256 are as fast: the larger wins the tie
    QVERIFY2(out.timed.count(128) == 0, "stops at the plateau, before sizes that are slower");
    QVERIFY2(out.reason.find("not faster") != std::string::npos, out.reason.c_str());
}

void TestThroughputSearch::peakThenFallFindsThePeak() {
    // The CPU measured in the issue (cnn, target 1024): smaller is faster down to 64, with a
    // dip at 128, then slower again.
    const Curve cpu = through({{1024, 2626},
                               {512, 3186},
                               {256, 4600},
                               {128, 4552},
                               {64, 5622},
                               {32, 4100},
                               {16, 2600},
                               {8, 1500},
                               {4, 800},
                               {2, 400},
                               {1, 200}});
    const std::vector<int64_t> candidates = throughputCandidates(1024, 1024, 1, 1);
    QCOMPARE(bestOf(candidates, cpu), int64_t(64));
    const Outcome out = run(options(1024, 1024), cpu, 0.01);
    QCOMPARE(out.chosen, int64_t(64));
    // Its speed over the largest, chained through the comparisons in turns, is the curve's.
    QVERIFY2(std::abs(out.overLargest / (cpu(64) / cpu(1024)) - 1) < 0.05,
             qPrintable(QString::number(out.overLargest)));
    QVERIFY2(out.timed.count(8) == 0, "stops two sizes past the best");
    QVERIFY2(out.reason.find("faster than the largest") != std::string::npos, out.reason.c_str());
}

void TestThroughputSearch::flatWithinNoiseKeepsTheLargest() {
    const Curve flat = [](int64_t) { return 5000.0; };
    ThroughputSearchOptions o = options(512, 512);
    const Outcome out = run(o, flat, 0.02);
    QCOMPARE(out.chosen, int64_t(512));
    // Ties are timed again, but never beyond the per-comparison cap or the budget: a challenger
    // is compared once, the largest (the incumbent all along) once per challenger.
    for (const auto& [size, count] : out.counted) {
        if (size != 512) QVERIFY(count <= o.maxRepetitions);
    }
    QVERIFY(out.spent <= o.budget);
}

void TestThroughputSearch::warmupsAreNotCounted() {
    // The first micro-batch of every size is 5× slower; counted, it would make every new size
    // look slow and the search would stop at the largest.
    const Curve curve =
        through({{256, 1000}, {128, 1500}, {64, 2000}, {32, 1200}, {16, 600}, {8, 300}, {4, 150}, {2, 80}, {1, 40}});
    QCOMPARE(run(options(256, 256), curve, 0, 5.0).chosen, int64_t(64));
}

void TestThroughputSearch::refinesBetweenHalvings() {
    // The fastest size, 86 (1024 in 12 micro-batches), lies between the halvings 128 and 64.
    const Curve peaked = [](int64_t n) { return 10000.0 - 3000.0 * std::abs(std::log(double(n) / 86.0)); };
    const Outcome out = run(options(1024, 1024), peaked, 0.005);
    QCOMPARE(out.chosen, int64_t(86));
    QVERIFY(out.timed.count(64) == 1 && out.timed.count(128) == 1);  // found from its neighbours
}

void TestThroughputSearch::budgetEndsTheSearch() {
    const Curve smallerIsFaster = [](int64_t n) { return 10000.0 / std::sqrt(static_cast<double>(n)); };
    ThroughputSearchOptions o = options(1024, 1024);
    o.repetitions = 3;
    // Warm-ups of 1024 and 512, then 1024, 512, 1024, 512, 1024 (every micro-batch ≥ 50 ms): 512
    // is √2× as fast in both turns, clear without a third; 256's warm-up, then 512, 256, 512 spend
    // 11 with one turn of that comparison done. Then 512 is timed against the largest as after
    // any walk, outside the budget: 4 turns that keep it (9 counted timings and 8 warm-ups, one
    // after every switch) and 4 fresh ones for the claim (9 and 8 again).
    o.budget = 11;
    const Outcome out = run(o, smallerIsFaster);
    QCOMPARE(out.chosen, int64_t(512));  // the best that was fully compared
    QCOMPARE(out.spent, 11 + 17 + 17);
    QVERIFY2(out.reason.find("the timing budget of 11 timings was spent; its gain measured in 4 more turns") !=
                 std::string::npos,
             out.reason.c_str());
    QVERIFY2(std::abs(out.overLargest - std::sqrt(2.0)) < 0.01, qPrintable(QString::number(out.overLargest)));
}

void TestThroughputSearch::clearDifferenceNeedsTwoTurns() {
    // 512 is 1.5× as fast as 1024: two turns show it. 256 is 5% faster than 512, beyond the 3%
    // noise but not twice it: three turns.
    const Curve curve =
        through({{1024, 2000}, {512, 3000}, {342, 3000}, {256, 3150}, {171, 2800}, {128, 2000}, {64, 1000}});
    const Outcome out = run(options(1024, 1024), curve);
    QCOMPARE(out.chosen, int64_t(256));
    // Around 512's two turns, then 4 more: 256 against the largest once more, every turn up to
    // the cap (maxRepetitions), however clear, and 4 more after them for the claim
    // (claimRepetitions): each time 4 timings of the largest, between 5 of 256's.
    QCOMPARE(out.counted.at(1024), 3 + 4 + 4);
    QCOMPARE(out.counted.at(512), 2 + 4);  // its two turns, then around 256's three
}

void TestThroughputSearch::driftSlowsBothSidesAlike() {
    // The machine slows down while the search runs (another process starts, a shared virtual
    // machine's neighbour wakes up): 5% per second of search, to half speed. Timed one after the
    // other, each smaller size would look slower by what the machine lost in between and the
    // search would keep the largest; timed in turns, the drift cancels and it finds the peak.
    const Curve curve = through({{1024, 3000}, {512, 3400}, {256, 3900}, {128, 3500}, {64, 3000}, {32, 2400}});
    const Drift slowing = [](double elapsed) { return std::max(0.5, 1.0 - 0.05 * elapsed); };
    const Outcome out = run(options(1024, 1024), curve, 0.01, 1.0, slowing);
    QCOMPARE(bestOf(throughputCandidates(1024, 1024, 1, 1), curve), int64_t(256));
    QCOMPARE(out.chosen, int64_t(256));
    // And speeding up (the neighbour finished) does not make smaller sizes look faster than they are.
    const Curve plateau = [](int64_t n) { return 8000.0 * static_cast<double>(std::min<int64_t>(n, 256)) / 256; };
    const Drift speeding = [](double elapsed) { return std::min(2.0, 1.0 + 0.05 * elapsed); };
    QCOMPARE(run(options(1024, 4096), plateau, 0.01, 1.0, speeding).chosen, int64_t(1024));
}

void TestThroughputSearch::oneCandidateTimesNothing() {
    ThroughputSearch search(options(1, 64));
    QVERIFY(search.done());
    QVERIFY(!search.next());
    QCOMPARE(search.chosen(), int64_t(1));
    QCOMPARE(search.overLargest(1), 1.0);  // the largest is its own reference, timed or not
    QCOMPARE(search.spent(), 0);
}

void TestThroughputSearch::shortMicroBatchesAreTimedTogether() {
    // 1.1 ms micro-batches: a timing spans them until 50 ms have passed, so one late micro-batch
    // (a scheduler hiccup of 21 ms) moves a timing by a third instead of one timing by 20×.
    ThroughputSearchOptions o = options(16, 64);
    o.justRan = 16;  // no warm-up for 16
    ThroughputSearch search(o);
    QCOMPARE(*search.next(), int64_t(8));  // the challenger's warm-up comes first
    search.record(8, 0.001);
    int64_t samples = 0;
    double seconds = 0;
    int microBatches = 0;
    while (search.candidates().front().samplesPerSecond.empty() && microBatches < 1000) {
        QCOMPARE(*search.next(), int64_t(16));  // the incumbent's turn until its timing is complete
        const double took = microBatches == 7 ? 0.021 : 0.0011;
        search.record(16, took);
        samples += 16;
        seconds += took;
        ++microBatches;
    }
    QCOMPARE(microBatches, 28);  // 27 × 1.1 ms + 21 ms ≥ 50 ms
    QCOMPARE(search.spent(), 29);
    QCOMPARE(search.timings(), 2);
    QCOMPARE(search.candidates().front().samplesPerSecond.front(), double(samples) / seconds);
    QCOMPARE(*search.next(), int64_t(8));  // then the challenger's turn
}

void TestThroughputSearch::abandonKeepsTheBestSoFar() {
    ThroughputSearchOptions o = options(256, 256);
    o.justRan = 256;  // the probe just ran 256: no warm-up for it
    ThroughputSearch search(o);
    // 256 runs at 1000 samples/s, 128 at 2000: 128 wins its comparison, then 64 is tried.
    const std::map<int64_t, double> rate{{256, 1000.0}, {128, 2000.0}, {64, 100.0}};
    int guard = 0;
    while (search.next() && *search.next() != 64 && ++guard < 100) {
        const int64_t n = *search.next();
        search.record(n, static_cast<double>(n) / rate.at(n));
    }
    QCOMPARE(*search.next(), int64_t(64));
    search.record(64, 64 / 100.0);
    search.abandon("an out-of-memory error interrupted the timing");
    QVERIFY(search.done());
    QCOMPARE(search.chosen(), int64_t(128));
    QCOMPARE(search.samplesPerSecond(128), 2000.0);
    QVERIFY2(search.reason().find("out-of-memory") != std::string::npos, search.reason().c_str());
}

void TestThroughputSearch::clearlySlowerEndsTheWalk() {
    // 512 is 40% slower than 1024: the walk ends there, 256 is never timed. 15% slower (a dip one
    // halving deep, as 128 in the curve) still lets the next halving be tried.
    const Curve falling = through({{1024, 3000}, {512, 1800}, {256, 1000}, {128, 500}});
    const Outcome out = run(options(1024, 1024), falling, 0.01);
    QCOMPARE(out.chosen, int64_t(1024));
    QCOMPARE(out.timed.count(256), size_t(0));
    QVERIFY2(out.reason.find("(512) was 40% slower") != std::string::npos, out.reason.c_str());
    const Curve dip = through({{1024, 3000}, {512, 2550}, {256, 4000}, {128, 2000}, {64, 1000}});
    QCOMPARE(run(options(1024, 1024), dip, 0.01).chosen, int64_t(256));
}

void TestThroughputSearch::startsFromTheChoiceBefore() {
    // The CPU curve on a larger device: the size chosen before, 64, is still the best.
    // Starting from it, the search times the sizes around it and never the slow largest ones,
    // whose single micro-batches take the longest.
    const Curve cpu =
        through({{1024, 2626}, {512, 3186}, {256, 4600}, {128, 4552}, {64, 5622}, {32, 4100}, {16, 2600}, {8, 1500}});
    ThroughputSearchOptions o = options(1024, 1024);
    o.start = 64;
    const Outcome fromStart = run(o, cpu, 0.01);
    const Outcome fromLargest = run(options(1024, 1024), cpu, 0.01);
    QCOMPARE(fromStart.chosen, int64_t(64));
    QCOMPARE(fromLargest.chosen, int64_t(64));
    QCOMPARE(fromStart.timed.count(1024), size_t(0));
    QCOMPARE(fromStart.timed.count(512), size_t(0));
    // Up to 128 (19% slower: one more), 256 (18% slower: the walk up ends), then down to 32
    // (27% slower: it ends at once), then the sizes half-way to the neighbours.
    QVERIFY(fromStart.timed.count(128) == 1 && fromStart.timed.count(256) == 1 && fromStart.timed.count(32) == 1);
    QVERIFY2(fromStart.spent < fromLargest.spent,
             qPrintable(QStringLiteral("%1 timings from the start, %2 from the largest")
                            .arg(fromStart.spent)
                            .arg(fromLargest.spent)));
    // The largest was not timed: no speed over it is claimed, and the reason says why.
    QCOMPARE(fromStart.overLargest, 0.0);
    QVERIFY2(fromStart.reason.find("(1024) was not timed") != std::string::npos, fromStart.reason.c_str());
    QVERIFY2(fromStart.reason.find("started from the size chosen before (64)") != std::string::npos,
             fromStart.reason.c_str());
}

void TestThroughputSearch::startBelowTheOptimumWalksUp() {
    // A GPU-like curve (rising to 256, flat above) after a move to a device with more memory:
    // from the size chosen before, 64, the search walks up past the plateau's start (ties go to
    // the larger size) to the largest, as a search from the largest would have kept it.
    const Curve plateau = [](int64_t n) { return 9000.0 * static_cast<double>(std::min<int64_t>(n, 256)) / 256; };
    ThroughputSearchOptions o = options(1024, 4096);
    o.start = 64;
    const Outcome out = run(o, plateau, 0.01);
    QCOMPARE(out.chosen, int64_t(1024));
    QCOMPARE(out.overLargest, 1.0);
    QCOMPARE(out.timed.count(32), size_t(0));  // something above was better: no walk down
    QVERIFY2(out.reason.find("the largest that fits") != std::string::npos, out.reason.c_str());
    // Rising all the way: each larger size wins outright up to the largest.
    const Curve rising = [](int64_t n) { return 100.0 * static_cast<double>(n); };
    o.start = 128;
    const Outcome up = run(o, rising);
    QCOMPARE(up.chosen, int64_t(1024));
    QVERIFY2(up.reason.find("the largest that fits was reached") != std::string::npos, up.reason.c_str());
}

void TestThroughputSearch::startIsRoundedToAnEvenSplit() {
    // 100 chosen for target 1024 before; the target is now 1000: 10 micro-batches of 100. It is
    // not a halving of 1000's candidates (500, 250, 125, …): it is inserted among them.
    ThroughputSearchOptions o = options(1000, 1000);
    o.start = 100;
    ThroughputSearch search(o);
    QCOMPARE(search.startedFrom(), int64_t(100));
    QCOMPARE(*search.next(), int64_t(100));  // its warm-up first
    const auto& plan = search.plan();
    QVERIFY(std::is_sorted(plan.rbegin(), plan.rend()));
    QVERIFY(std::find(plan.begin(), plan.end(), int64_t(100)) != plan.end());
    // A start at or above the largest is the largest; one that no longer fits is ignored.
    o.start = 4000;
    QCOMPARE(ThroughputSearch(o).startedFrom(), int64_t(1000));
    o.start = 0;
    QCOMPARE(ThroughputSearch(o).startedFrom(), int64_t(1000));
}

void TestThroughputSearch::driftWatchActsOnLastingChanges() {
    // Windows of 5 steps, ±15%. Steady training with ±8% noise and a single step at half speed
    // (a checkpoint, a page fault) never asks for a new search: the window's median resists them.
    DriftWatch steady(5, 0.15);
    const double noise[] = {1.0, 1.08, 0.92, 1.03, 0.97};
    for (int step = 0; step < 100; ++step) {
        const double rate = step == 42 ? 500.0 : 1000.0 * noise[step % 5];
        QVERIFY2(!steady.observe(rate), qPrintable(QStringLiteral("step %1").arg(step)));
    }
    QCOMPARE(steady.baseline(), 1000.0);
    // A lasting slowdown of 30% from step 12: the window of steps 11-15 holds four slow steps, so
    // its median is the slow speed and the search is asked for at step 15.
    DriftWatch slowing(5, 0.15);
    int askedAt = -1;
    std::string why;
    for (int step = 1; step <= 30 && askedAt < 0; ++step) {
        if (auto reason = slowing.observe(step >= 12 ? 700.0 : 1000.0)) {
            askedAt = step;
            why = *reason;
        }
    }
    QCOMPARE(askedAt, 15);
    QVERIFY2(why.find("700 samples/s") != std::string::npos && why.find("-30%") != std::string::npos &&
                 why.find("1000 samples/s") != std::string::npos && why.find("15%") != std::string::npos,
             why.c_str());
    // Faster counts too (the neighbour's job ended: a smaller size may now win), and a change
    // within the threshold does not.
    DriftWatch faster(4, 0.15);
    for (int step = 1; step <= 4; ++step) QVERIFY(!faster.observe(1000));
    for (int step = 1; step <= 3; ++step) QVERIFY(!faster.observe(1400));
    QVERIFY(faster.observe(1400).has_value());
    DriftWatch small(4, 0.15);
    for (int step = 1; step <= 40; ++step) QVERIFY(!small.observe(step <= 4 ? 1000 : 1120));
    // Steps without a throughput (a zero-length clock reading) are not counted.
    DriftWatch zeros(2, 0.15);
    QVERIFY(!zeros.observe(1000));
    QVERIFY(!zeros.observe(0));
    QVERIFY(!zeros.observe(1000));
    QCOMPARE(zeros.baseline(), 1000.0);
}

void TestThroughputSearch::stepGainCountsWhatBatchesCostBesides() {
    // Target 1024: the largest, 1024, at 1000 samples/s; 128 (8 micro-batches) 1.5x as fast.
    // Nothing besides the micro-batches: the micro-batches' gain is the batch's.
    QCOMPARE(stepSpeedOverLargest(1024, 128, 1024, 1000, 1.5, {}), 1.5);
    // A 200 ms optimizer step and 10 ms per micro-batch, by hand:
    // largest (1.024 + 1 x 0.01 + 0.2) / (1024 / 1500 + 8 x 0.01 + 0.2) = 1.234 / 0.962667.
    const double gain = stepSpeedOverLargest(1024, 128, 1024, 1000, 1.5, {0.01, 0.2});
    QVERIFY2(std::abs(gain - 1.234 / 0.9626667) < 1e-6, qPrintable(QString::number(gain)));
    QVERIFY(gain < 1.5);
    // A large cost per micro-batch makes the faster micro-batches the slower batches: 8 of them
    // pay it 8 times (1.124 s at 1024 against 1.4827 s at 128).
    QVERIFY(stepSpeedOverLargest(1024, 128, 1024, 1000, 1.5, {0.1, 0.0}) < 1.0);
    // An uneven split counts its extra micro-batch: 1000 samples at 300 are 4 micro-batches.
    const double uneven = stepSpeedOverLargest(1000, 300, 1000, 1000, 1.0, {0.05, 0.0});
    QVERIFY2(std::abs(uneven - 1.05 / 1.2) < 1e-9, qPrintable(QString::number(uneven)));
    // Unknown speeds claim nothing.
    QCOMPARE(stepSpeedOverLargest(1024, 128, 1024, 0, 1.5, {}), 0.0);
    QCOMPARE(stepSpeedOverLargest(1024, 128, 1024, 1000, 0, {}), 0.0);
}

void TestThroughputSearch::stepCostsAreMediansOfCleanBatches() {
    StepCostWatch watch(3);
    QVERIFY(!watch.measured());
    QCOMPARE(watch.costs().perStepSeconds, 0.0);
    // 4 micro-batches timed at 0.8 s in all, the loop over them ended at 0.84 s, the step at 1.0 s:
    // 10 ms per micro-batch, 160 ms per batch.
    watch.observe(4, 0.8, 0.84, 1.0);
    QVERIFY(watch.measured());
    QVERIFY(std::abs(watch.costs().perMicroBatchSeconds - 0.01) < 1e-12);
    QVERIFY(std::abs(watch.costs().perStepSeconds - 0.16) < 1e-12);
    // One slow batch (a checkpoint written) does not move the median; the window forgets the oldest.
    watch.observe(4, 0.8, 0.84, 3.0);
    watch.observe(4, 0.8, 0.84, 1.1);
    QVERIFY(std::abs(watch.costs().perStepSeconds - 0.26) < 1e-12);
    watch.observe(2, 0.4, 0.42, 0.5);  // the window now holds 2.16, 0.26 and 0.08
    QVERIFY(std::abs(watch.costs().perStepSeconds - 0.26) < 1e-12);
    // Nonsense is ignored: no micro-batch, a step shorter than its loop.
    watch.observe(0, 0, 0, 1.0);
    watch.observe(2, 0.4, 0.5, 0.45);
    QVERIFY(std::abs(watch.costs().perStepSeconds - 0.26) < 1e-12);
}

void TestThroughputSearch::theGainIsTimedAgainstTheLargestOnceMore() {
    // The walk keeps a challenger whose timings came out faster; some of that can be luck (a
    // neighbour idle for a second). Here 512's first timings run 10% faster than it really does:
    // the walk takes it, and the comparison with the largest that follows, in turns, finds the
    // two equally fast, so the largest is kept and the reason says what happened.
    const auto runWith = [](ThroughputSearchOptions o, const std::function<double(int64_t, int)>& speed) {
        ThroughputSearch search(o);
        std::map<int64_t, int> runs;
        int guard = 0;
        while (auto size = search.next()) {
            const double rate = speed(*size, runs[*size]++);
            search.record(*size, static_cast<double>(*size) / rate);
            if (++guard > 5000) break;
        }
        return std::make_pair(search.chosen(), search);
    };
    // The truth: 1024 and 512 at 3000 samples/s, 256 and below much slower.
    const auto luckyAtFirst = [](int64_t n, int run) {
        if (n == 1024) return 3000.0;
        if (n == 512) return run < 8 ? 3300.0 : 3000.0;
        return 1500.0;
    };
    auto [tied, tiedSearch] = runWith(options(1024, 1024), luckyAtFirst);
    QCOMPARE(tied, int64_t(1024));
    QCOMPARE(tiedSearch.overLargest(1024), 1.0);
    QVERIFY2(tiedSearch.reason().find("512 looked 10% faster") != std::string::npos, tiedSearch.reason().c_str());
    // A real gain measured too high by the walk: 512 is 1.2x the largest, its first timings
    // 1.35x. The claim is the second comparison's 1.2, not the walk's 1.35.
    const auto overstated = [](int64_t n, int run) {
        if (n == 1024) return 3000.0;
        if (n == 512) return run < 8 ? 4050.0 : 3600.0;
        return 1500.0;
    };
    auto [kept, keptSearch] = runWith(options(1024, 1024), overstated);
    QCOMPARE(kept, int64_t(512));
    QVERIFY2(std::abs(keptSearch.overLargest(512) - 1.2) < 0.01,
             qPrintable(QString::number(keptSearch.overLargest(512))));
    QVERIFY2(keptSearch.reason().find("20% faster than the largest") != std::string::npos, keptSearch.reason().c_str());
    // The comparison with the largest keeps a size only when its turns came out faster by more
    // than the noise: luck there is why it is kept, so its number is not the claim either. Here
    // 512 is 1.1x the largest, its micro-batches in the turns that keep it 1.3x (its 10th to 23rd
    // micro-batches; the walk took 9); the claim is the 4 fresh turns' 1.1, and the speeds shown
    // with it are theirs too.
    const auto luckyTwice = [](int64_t n, int run) {
        if (n == 1024) return 3000.0;
        if (n == 512) return run < 8 ? 4050.0 : run < 23 ? 3900.0 : 3300.0;
        return 1500.0;
    };
    auto [fresh, freshSearch] = runWith(options(1024, 1024), luckyTwice);
    QCOMPARE(fresh, int64_t(512));
    QVERIFY2(std::abs(freshSearch.overLargest(512) - 1.1) < 0.01,
             qPrintable(QString::number(freshSearch.overLargest(512))));
    QCOMPARE(freshSearch.samplesPerSecond(512), 3300.0);
    QCOMPARE(freshSearch.samplesPerSecond(1024), 3000.0);
    QVERIFY2(freshSearch.reason().find("micro-batch 512 at 3300 samples/s") != std::string::npos,
             freshSearch.reason().c_str());
    QVERIFY2(freshSearch.reason().find("10% faster than the largest") != std::string::npos &&
                 freshSearch.reason().find("4 more turns with the largest, after the 4 that kept it (30% faster "
                                           "there)") != std::string::npos,
             freshSearch.reason().c_str());
    // Without the fresh turns (claimRepetitions 0) the turns that kept it claim their 1.3.
    ThroughputSearchOptions keptTurns = options(1024, 1024);
    keptTurns.claimRepetitions = 0;
    auto [noFresh, noFreshSearch] = runWith(keptTurns, luckyTwice);
    QCOMPARE(noFresh, int64_t(512));
    QVERIFY2(std::abs(noFreshSearch.overLargest(512) - 1.3) < 0.01,
             qPrintable(QString::number(noFreshSearch.overLargest(512))));
    // Fresh turns that find no gain keep the largest: the gain was luck twice over. Nor does a
    // gain too small to show (0.3%, under the 0.5% shown as a tie): a tie goes to the larger.
    for (const double fresh : {2995.0, 3010.0}) {
        const auto noGain = [fresh](int64_t n, int run) {
            if (n == 1024) return 3000.0;
            if (n == 512) return run < 8 ? 4050.0 : run < 23 ? 3900.0 : fresh;
            return 1500.0;
        };
        auto [held, heldSearch] = runWith(options(1024, 1024), noGain);
        QCOMPARE(held, int64_t(1024));
        QCOMPARE(heldSearch.overLargest(1024), 1.0);
        QVERIFY2(heldSearch.reason().find("512 was kept by 4 turns with the largest (30% faster there), but in 4 "
                                          "more it was as fast as the largest") != std::string::npos,
                 heldSearch.reason().c_str());
    }
    // Without the second comparison (ThroughputSearchOptions::confirm off) the walk's 1.35 stands.
    ThroughputSearchOptions walkOnly = options(1024, 1024);
    walkOnly.confirm = false;
    auto [walked, walkedSearch] = runWith(walkOnly, overstated);
    QCOMPARE(walked, int64_t(512));
    QVERIFY2(std::abs(walkedSearch.overLargest(512) - 1.35) < 0.01,
             qPrintable(QString::number(walkedSearch.overLargest(512))));
}

void TestThroughputSearch::comparisonsCutShortSayWhatTheyClaim() {
    // 512 is 1.1x the largest (1024): the walk's turns saw 1.35x, the turns that keep it 1.3x (its
    // 10th to 23rd micro-batches), the fresh ones 1.1x. An out-of-memory error ends the search
    // partway (SizeChoice::abandonTiming): what it claims is the best measured by then, and the
    // reason says which measure that is.
    const auto abandonedAt = [](int cutAt512) {
        ThroughputSearch search(options(1024, 1024));
        std::map<int64_t, int> runs;
        int guard = 0;
        while (auto size = search.next()) {
            if (*size == 512 && runs[512] == cutAt512) {
                search.abandon("an out-of-memory error interrupted the timing");
                break;
            }
            const int run = runs[*size]++;
            const double rate = *size == 1024  ? 3000.0
                                : *size == 512 ? (run < 9    ? 4050.0
                                                  : run < 23 ? 3900.0
                                                             : 3300.0)
                                               : 1500.0;
            search.record(*size, static_cast<double>(*size) / rate);
            if (++guard > 5000) break;
        }
        return search;
    };
    const ThroughputSearch inFresh = abandonedAt(25);
    QVERIFY(inFresh.done());
    QCOMPARE(inFresh.chosen(), int64_t(512));
    QVERIFY2(std::abs(inFresh.overLargest(512) - 1.3) < 0.01, qPrintable(QString::number(inFresh.overLargest(512))));
    QVERIFY2(inFresh.reason().find("out-of-memory error interrupted the timing before fresh turns measured its "
                                   "gain: the turns that kept it claim it") != std::string::npos,
             inFresh.reason().c_str());
    const ThroughputSearch inDeciding = abandonedAt(12);
    QCOMPARE(inDeciding.chosen(), int64_t(512));
    QVERIFY2(std::abs(inDeciding.overLargest(512) - 1.35) < 0.01,
             qPrintable(QString::number(inDeciding.overLargest(512))));
    QVERIFY2(
        inDeciding.reason().find("before its gain was timed once more: the walk's own measure") != std::string::npos,
        inDeciding.reason().c_str());

    // From the size chosen before (512) the walk goes up; the budget ends it before 512 was
    // compared with the largest. The comparison with the largest still runs, and the reason does
    // not quote a gain the walk never measured (it once said "looked -100% faster").
    ThroughputSearchOptions o = options(1024, 1024);
    o.start = 512;
    o.budget = 4;  // 512's warm-up, 1024's, then one timing of each: the turn is not complete
    const Outcome flat = run(o, [](int64_t) { return 3000.0; });
    QCOMPARE(flat.chosen, int64_t(1024));
    QVERIFY2(flat.reason.find("512, the best when the walk ended, had not been compared with the largest, but "
                              "timed in turns with the largest once more it was not faster") != std::string::npos,
             flat.reason.c_str());
    QVERIFY2(flat.reason.find("looked") == std::string::npos, flat.reason.c_str());
}

void TestThroughputSearch::everyWarmupIsLeftOut() {
    // Two warm-ups a size: on a flat curve (the largest is kept, nothing is timed again) every size
    // ran exactly two micro-batches more than its counted timings (one micro-batch each here).
    ThroughputSearchOptions o = options(1024, 1024);
    o.warmups = 2;
    const Outcome out = run(o, [](int64_t) { return 3000.0; });
    QCOMPARE(out.chosen, int64_t(1024));
    for (const auto& [size, counted] : out.counted)
        QVERIFY2(
            out.timed.at(size) - counted == 2,
            qPrintable(
                QStringLiteral("%1: %2 micro-batches, %3 counted").arg(size).arg(out.timed.at(size)).arg(counted)));
}

void TestThroughputSearch::aClockWithoutTimeEndsTheSearch() {
    ThroughputSearch search(options(1024, 1024));
    int guard = 0;
    while (auto size = search.next()) {
        search.record(*size, 0.0);
        if (++guard > 1000) break;
    }
    QVERIFY(search.done());
    QCOMPARE(guard, 2 + 256);  // the two sizes' warm-ups (not timed), then 256 without a time
    QCOMPARE(search.chosen(), int64_t(1024));
    QVERIFY2(search.reason().find("the clock gave no usable time for 256 micro-batches in a row") != std::string::npos,
             search.reason().c_str());
}

void TestThroughputSearch::batchCheckSpreadsItsTurnsOverTheSpan() {
    // At least 3 turns, at most 8 s: with the first batch taking 0.5 s, a turn is 2 s (8 s over the
    // 3 turns and the warm-up; kTurnSeconds is no shorter), so 3 batches of the chosen size lie
    // between two of the largest. The three turns' ratios spread 7% around their median: not
    // known to 2%, the check ends when the batches took the 8 s (10.5 s with the last turn).
    BatchCheck check(50, 100, 3, 8.0);
    QCOMPARE(check.next(), int64_t{50});
    QCOMPARE(check.period(), 0);
    std::string sizes;
    // The chosen size at 240 samples/s, then 230, 220, …; the largest at 100, then 90, 80, …:
    // each turn divides the mean of the chosen size's batches around a batch of the largest by it.
    double chosenRate = 250, largestRate = 110;
    for (int batch = 0; batch < 40 && !check.done(); ++batch) {
        const int64_t size = check.next();
        sizes += size == 50 ? 'c' : 'L';
        // Another size, or the one the check did not ask for now, counts for nothing.
        check.observe(77, 1000, 0.1);
        check.observe(size == 50 ? 100 : 50, 1000, 0.1);
        if (size == 50) {
            chosenRate -= 10;
            check.observe(50, chosenRate, 0.5);
        } else {
            largestRate -= 10;
            check.observe(100, largestRate, 1.0);
        }
    }
    QCOMPARE(check.period(), 3);
    QVERIFY(check.done());
    // The warm-up of the largest (L after the first 3) is not a turn; the 3 turns follow.
    QCOMPARE(QString::fromStdString(sizes), QStringLiteral("cccLcccLcccLcccLc"));
    QCOMPARE(check.batchesOf(100), 4);
    QCOMPARE(check.batchesOf(50), 13);
    // Turns (the largest's 100 was the warm-up): the chosen size's 190 and 180 around the
    // largest's 90; 160 and 150 around 80; 130 and 120 around 70.
    const std::vector<double> expected{185.0 / 90, 155.0 / 80, 125.0 / 70};
    QCOMPARE(check.ratios().size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) QVERIFY(std::abs(check.ratios()[i] - expected[i]) < 1e-12);
    QVERIFY(std::abs(check.gain() - 155.0 / 80) < 1e-12);
    QCOMPARE(check.next(), int64_t{50});  // done: the chosen size from now on
    QCOMPARE(check.seconds(), 13 * 0.5 + 4 * 1.0);

    // Batches too short for the span to need more: every other one (the least); batches far too
    // short: at most every kMaxPeriod + 1st.
    BatchCheck slow(50, 100, 5, 1.0);
    slow.observe(50, 100, 10.0);
    QCOMPARE(slow.period(), 1);
    BatchCheck fast(50, 100, 5, 60.0);
    fast.observe(50, 100, 0.001);
    QCOMPARE(fast.period(), BatchCheck::kMaxPeriod);
    // No time measured (a clock that did not move) is no turn: nothing counted.
    BatchCheck still(50, 100, 5, 10.0);
    still.observe(50, 0, 0);
    QCOMPARE(still.period(), 0);
    QCOMPARE(still.gain(), 0.0);
}

void TestThroughputSearch::medianIntervalCoversTheMedianNineteenTimesInTwenty() {
    // The order statistics of the tables for a median's 95% confidence interval (e.g. Conover,
    // Practical Nonparametric Statistics, table A3): n = 9: the 2nd and 8th; 20: 6th and 15th;
    // 30: 10th and 21st; 6: the extremes (1/64 each side). Values 1..n shuffled: the k-th is k.
    const auto of = [](int n) {
        std::vector<double> values;
        for (int i = n; i >= 1; --i) values.push_back(i);  // any order
        return medianInterval(values);
    };
    // n, then the median and the interval's order statistics; under six no pair covers 95%: the
    // extremes, said so (n = 3).
    const struct {
        int n;
        double median, low, high;
    } table[] = {
        {9, 5.0, 2.0, 8.0}, {20, 10.5, 6.0, 15.0}, {30, 15.5, 10.0, 21.0}, {6, 3.5, 1.0, 6.0}, {3, 2.0, 1.0, 3.0}};
    for (const auto& row : table) {
        const MedianInterval m = of(row.n);
        QCOMPARE(m.median, row.median);
        QCOMPARE(m.low, row.low);
        QCOMPARE(m.high, row.high);
    }
    QCOMPARE(medianInterval({}).median, 0.0);
    QCOMPARE(medianInterval({1.04}).low, 1.04);
    QVERIFY(std::abs(of(9).relativeHalfWidth() - 3.0 / 5.0) < 1e-12);

    // And what the interval promises: samples of a skewed distribution with a known median (an
    // exponential's, ln 2 / rate), n = 9 and n = 25 — it covers that median at least 95% of the
    // time, and not far more (n = 9: exactly 1 - 2·10/512 = 96.1%).
    std::mt19937 random(7);
    std::exponential_distribution<double> exponential(2.0);
    const double trueMedian = std::log(2.0) / 2.0;
    for (const int n : {9, 25}) {
        const int draws = 20000;
        int covered = 0;
        for (int d = 0; d < draws; ++d) {
            std::vector<double> values(static_cast<size_t>(n));
            for (double& v : values) v = exponential(random);
            const MedianInterval interval = medianInterval(values);
            if (interval.low <= trueMedian && trueMedian <= interval.high) ++covered;
        }
        const double coverage = static_cast<double>(covered) / draws;
        QVERIFY2(coverage >= 0.945 && coverage <= 0.975, qPrintable(QStringLiteral("n = %1: %2").arg(n).arg(coverage)));
    }
}

/// Drives a check: the chosen size always at 100 samples/s, the largest's batch of turn i at
/// 100 / ratio(i) — so that turn i's ratio is ratio(i) — each batch `seconds` long. Returns the turns run.
static size_t runCheck(BatchCheck& check, const std::function<double(size_t)>& ratio, double seconds) {
    for (int batch = 0; batch < 10000 && !check.done(); ++batch) {
        if (check.next() == check.chosen()) {
            check.observe(check.chosen(), 100, seconds);
        } else {
            // The warm-up first (counted for nothing), then turn number ratios().size().
            check.observe(check.largest(), 100 / ratio(check.ratios().size()), seconds);
        }
    }
    return check.ratios().size();
}

void TestThroughputSearch::batchCheckGoesOnUntilTheGainIsKnown() {
    // Speeds that hold still (a GPU of one's own): nine turns, the fewest, though 60 s would allow
    // many more.
    BatchCheck still(50, 100, 9, 60.0);
    QCOMPARE(runCheck(
                 still, [](size_t) { return 1.1; }, 0.5),
             size_t{9});
    QCOMPARE(still.interval().low, still.interval().high);
    QVERIFY(still.seconds() < 60);

    // Turns ±6% apart, 1.06 and 0.94 by turns (a shared machine): never known to 2%; the check
    // goes on until the batches took the 60 s. Turns of 2 s: 0.5 s batches, three of the chosen
    // size and one of the largest.
    BatchCheck noisy(50, 100, 9, 60.0);
    const auto alternating = [](size_t i) { return i % 2 == 0 ? 1.06 : 0.94; };
    const size_t turns = runCheck(noisy, alternating, 0.5);
    QCOMPARE(noisy.period(), 3);
    QVERIFY2(turns > 9, qPrintable(QString::number(turns)));
    QVERIFY(noisy.seconds() >= 60 && noisy.seconds() < 60 + 2.0);
    // 60 s of 2 s turns, less the warm-up and the first batches: 28 turns.
    QCOMPARE(turns, size_t{28});
    QCOMPARE(noisy.interval().low, 0.94);
    QCOMPARE(noisy.interval().high, 1.06);

    // With all the time in the world: at most kMaxTurns.
    BatchCheck endless(50, 100, 9, 3600.0);
    QCOMPARE(runCheck(endless, alternating, 0.5), size_t(BatchCheck::kMaxTurns));

    // Two outlying turns at first, then turns within ±1%: not known after nine (the 8th of nine
    // is an outlier, the interval reaches 1.25), known to 2% once enough turns outvote them — at
    // 12 turns the interval is the 3rd to the 10th — long before the 60 s.
    BatchCheck outliers(50, 100, 9, 60.0);
    const auto twoOutliers = [](size_t i) { return i < 2 ? 1.25 : (i % 2 == 0 ? 1.01 : 0.99); };
    QCOMPARE(runCheck(outliers, twoOutliers, 0.5), size_t{12});
    QVERIFY(outliers.seconds() < 30);
    QVERIFY(std::abs(outliers.gain() - 1.0) < 0.011);

    // A short span shortens the turns so that the fewest still fit: 3 s over 9 turns and the
    // warm-up is 0.3 s a turn, every other batch of 0.1 s.
    BatchCheck brief(50, 100, 9, 3.0);
    QCOMPARE(runCheck(brief, alternating, 0.1), size_t{9});
    QCOMPARE(brief.period(), 2);
}

}  // namespace tst_throughput_search

BATCHPILOT_TEST_MAIN(tst_throughput_search::TestThroughputSearch)
#include "tst_throughput_search.moc"
