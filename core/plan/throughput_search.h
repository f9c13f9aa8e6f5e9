#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace batchpilot::core {

struct ThroughputSearchOptions {
    int64_t largest = 1;     ///< the largest micro-batch that fits (the memory search's result)
    int64_t target = 1;      ///< the training batch the micro-batches add up to
    int64_t multipleOf = 1;  ///< candidates are multiples of this (when at least this large)
    int64_t smallest = 1;    ///< no candidate below this (a BatchNorm model needs 2)
    int warmups = 1;         ///< timed micro-batches of a new size that are not counted (caches, kernels)
    int64_t justRan = 0;     ///< a size that just ran (the probe's last trial): no warm-up for it
    /// The size an earlier search of this run chose (0: none). When it still fits, the search
    /// starts from it (rounded to an even split of the target) instead of the largest: after a
    /// larger budget on the same hardware the old optimum is the likeliest one, and the largest
    /// sizes are the slowest to time.
    int64_t start = 0;
    /// Challenger timings per comparison before judging (3: a spread to judge by), unless the
    /// first two already differ clearly (both beyond twice the noise, the same way).
    int repetitions = 3;
    int maxRepetitions = 4;  ///< per comparison, while the difference is within the noise
    /// Timings for the walk and the sizes between, warm-ups included. The comparisons with the
    /// largest that follow add at most 4 · (maxRepetitions + claimRepetitions) + 4 (fixed turns).
    int budget = 80;
    /// A timing spans consecutive micro-batches of one size until they took this long: one
    /// micro-batch of a few milliseconds is mostly timer and scheduler noise.
    double minTimingSeconds = 0.05;
    /// … or until they held this many samples (0: no such limit), whichever comes first: on a fast
    /// device 50 ms are several training batches, and a short run cannot spend that many on one
    /// timing (SizeChoice sets it from the run's share it gives the timing).
    int64_t maxTimingSamples = 0;
    /// Samples the search may train while it times, warm-ups and the comparisons with the largest
    /// included (0: no limit). Once they are spent the search ends at once with the best measured
    /// so far, as abandon() does: the run's length bounds what finding the size may cost.
    int64_t sampleBudget = 0;
    double noise = 0.03;  ///< smallest relative difference in samples/s that counts as real
    /// A challenger this much slower than the best ends the walk in its direction at once; a
    /// smaller difference still lets one more size be tried (a cache-sized step further on).
    double clearlySlower = 0.25;
    /// After the walk, time a chosen size below the largest against the largest once more, in
    /// turns (maxRepetitions of them); a tie there keeps the largest (see ThroughputSearch).
    bool confirm = true;
    /// Turns with the largest that measure the gain claimed, after that comparison kept a smaller
    /// size: fresh ones, since the turns that kept it are biased toward it (0: claim those).
    int claimRepetitions = 4;
    /// A timing while comparing with the largest spans this many times minTimingSeconds: there
    /// the number is the claim, not only its direction.
    double confirmTimingFactor = 4;
};

/// Chooses the micro-batch with the highest measured throughput, by timing real training
/// micro-batches (the caller trains on them: nothing is wasted). A pure state machine like
/// ProbeSearch: next() says which size to run, record() takes its time.
///
/// Candidates are the largest size that fits and its halvings, each rounded to the size that
/// splits the target batch evenly (so no candidate leaves a small remainder micro-batch). The
/// search walks from the largest (or from `start`, a size chosen before) to smaller sizes while
/// they are faster by more than the noise, and stops after two in a row that are not (the
/// plateau: a larger micro-batch buys nothing more) or one that is clearly slower. From `start`
/// it first walks up the same way (a tie goes up: the larger size wins it), and down only when
/// nothing above was better. Then it times the sizes half-way (in micro-batches per training
/// batch) between the best and its timed neighbours, since the fastest size may lie between two
/// halvings.
///
/// Each comparison pits a challenger against the best size so far, timed in turns — best,
/// challenger, best, …, best — so that every challenger timing lies between two of the best's
/// (a timing covers micro-batches worth at least minTimingSeconds). A machine whose speed drifts
/// while the search runs (other processes, a shared virtual machine, clocks) then slows both
/// alike: each challenger timing is divided by the mean of the two around it, and the median of
/// these ratios decides (after three turns, or two that both differ by more than twice the noise
/// the same way). While it is within the noise (the option's, or the ratios' own spread if
/// larger) the pair is timed again, up to maxRepetitions, and a tie goes to the larger size. A new
/// size's first micro-batch is a warm-up, not counted. When the budget is spent the walk ends
/// there, and the best so far goes on to the comparison below; the reason says so.
///
/// A size below the largest is then timed once more against the largest, in turns as above: the
/// walk kept every challenger whose ratio came out above the noise, so the product of those
/// ratios overstates the chosen size's gain by the noise that made it win (measured: claims 8-10%
/// above what whole training batches then showed, docs/PERFORMANCE.md §6). Within the noise
/// there, the largest is kept. The same holds for that comparison: it keeps the size only when
/// its turns came out faster by more than the noise, so its own ratio overstates the gain again
/// (measured: +2 to +8%). The gain overLargest() reports is therefore measured in
/// claimRepetitions turns more, which decide nothing but whether the gain held up at all (a
/// fresh median that is not faster keeps the largest).
class ThroughputSearch {
public:
    struct Candidate {
        int64_t microBatch = 0;
        std::vector<double> samplesPerSecond;  ///< all counted timings, in order (warm-ups left out)
        int warmupsDone = 0;
        /// Its speed over the first size timed (the largest, or the start), from the comparisons
        /// in turns that led to it (the product of their paired ratios); 0 while not compared.
        double overFirst = 0;
        double pendingSeconds = 0;  ///< micro-batches of the timing in progress
        int64_t pendingSamples = 0;
        int pendingMicroBatches = 0;
        double median() const;
    };

    explicit ThroughputSearch(const ThroughputSearchOptions& options);

    /// The size to run next, or nothing when the search has decided.
    std::optional<int64_t> next() const;
    /// A micro-batch of `microBatch` samples (the size next() gave) took `seconds`.
    void record(int64_t microBatch, double seconds);
    /// Ends the search now with the best measured so far (e.g. an out-of-memory error intervened);
    /// cut short while comparing with the largest, the gain claimed is the best measured so far
    /// too (the deciding turns', or the walk's), and the reason says which.
    void abandon(const std::string& why);

    bool done() const { return m_done; }
    /// The chosen micro-batch (the largest size until something faster was measured).
    int64_t chosen() const;
    /// Why it was chosen, in words, with the numbers.
    const std::string& reason() const { return m_reason; }
    /// Candidates timed so far, in the order they were first timed.
    const std::vector<Candidate>& candidates() const { return m_timed; }
    /// The sizes the search tried or may try: the halvings (and the start), largest first, then
    /// the sizes between the best and its neighbours that it added once the walk ended.
    const std::vector<int64_t>& plan() const { return m_plan; }
    /// Timed micro-batches so far (warm-ups included).
    int spent() const { return m_spent; }
    /// Timings so far (warm-ups included): what the budget counts.
    int timings() const { return m_timings; }
    /// Samples of the micro-batches timed so far (warm-ups included): what sampleBudget counts.
    int64_t samples() const { return m_samples; }
    /// The measured throughput of a candidate (after fresh turns measured the claim, the chosen
    /// size's and the largest's there); 0 when it was not timed.
    double samplesPerSecond(int64_t microBatch) const;
    /// A candidate's speed over the largest size's, measured in turns (through
    /// Candidate::overFirst); 1 for the largest, 0 when either was not compared (a search from
    /// `start` may never time the largest).
    double overLargest(int64_t microBatch) const;
    /// The size the search started from: the largest, or the rounded `start`.
    int64_t startedFrom() const { return m_plan.empty() ? 0 : m_plan[m_startIndex]; }

private:
    /// record() before the sample budget is looked at.
    void take(int64_t microBatch, double seconds);
    void decide();
    /// The comparison in progress ended: the challenger is better, not better, or tied.
    void judged(bool challengerWins, bool tie, double ratio);
    /// The next size of the walk, or the end of the walk.
    void walkOn(double ratio);
    /// Times the halving at plan index `index` next, or ends the walk when the budget is spent.
    void challenge(size_t index);
    /// The walk ended (`cause`): time the sizes between the best and its neighbours.
    void endWalk(const std::string& cause);
    void nextRefinement();
    void finish(const std::string& reason);
    void finishOnBudget();
    /// The walk and the sizes between are done: compare the chosen size with the largest once
    /// more (ThroughputSearchOptions::confirm), or finish.
    void confirmOrFinish();
    /// That comparison ended: the largest's speed over the chosen size's is `ratio`.
    void confirmed(double ratio, double noise);
    /// The turns that measure the claim ended (`turns` of them): the largest's speed over the
    /// chosen size's is `ratio`.
    void claimed(double ratio, size_t turns);
    /// Ends the search with the chosen size's gain over the largest measured as `gain`.
    void keepChosen(double gain, const std::string& how);
    const Candidate* find(int64_t microBatch) const;
    Candidate& incumbent() { return m_timed[m_best]; }
    const Candidate& incumbent() const { return m_timed[m_best]; }
    Candidate& challenger() { return m_timed[m_challenger]; }
    const Candidate& challenger() const { return m_timed[m_challenger]; }
    /// Whether the next micro-batch is the incumbent's (its warm-up first, then the
    /// challenger's, then the turns).
    bool incumbentActive() const;

    ThroughputSearchOptions m_options;
    std::vector<int64_t> m_plan;
    std::vector<Candidate> m_timed;       ///< in the order first timed; the last is the challenger
    size_t m_best = 0;                    ///< index in m_timed of the best candidate so far (the incumbent)
    size_t m_challenger = 0;              ///< index in m_timed of the size compared with it
    size_t m_startIndex = 0;              ///< plan index of the size the walk started from
    bool m_walkingUp = false;             ///< from `start`, toward the largest
    size_t m_edge = 0;                    ///< plan index of the walk's latest challenger
    int m_notFaster = 0;                  ///< challengers in a row, in this direction, that lost
    std::vector<double> m_challengerRun;  ///< the comparison's challenger timings
    std::vector<double> m_incumbentRun;   ///< the comparison's incumbent timings, one more when complete
    bool m_incumbentTurn = true;          ///< whose timing is next in the comparison
    int m_spent = 0;
    int m_timings = 0;
    int64_t m_samples = 0;
    bool m_refining = false;                 ///< the walk ended; timing the sizes between
    std::vector<int64_t> m_refinements;      ///< sizes between the halvings still to time
    std::string m_walkCause;                 ///< why the walk ended
    bool m_confirming = false;               ///< timing the chosen size against the largest once more
    bool m_claiming = false;                 ///< … in the turns after those that kept it: the claim
    double m_decidedGain = 0;                ///< the chosen size's gain in the turns that kept it
    std::map<int64_t, double> m_claimRates;  ///< the chosen size's and the largest's speed in the fresh turns
    int m_untimed = 0;                       ///< micro-batches in a row whose time did not count
    int64_t m_lastSize = 0;                  ///< the size of the micro-batch recorded last
    int64_t m_confirmedSize = 0;             ///< the size whose gain that comparison measured (0: none)
    double m_confirmedOverLargest = 0;       ///< its speed over the largest's, from that comparison
    bool m_done = false;
    std::string m_reason;
};

/// The median of `values` and where it lies with 95% confidence, distribution-free: the order
/// statistics around the middle that a binomial(n, ½) count of values below the true median
/// leaves outside only 2.5% of the time each side (n = 9: the 2nd and 8th of nine, 96%). No turn's
/// spread is assumed, so an outlying turn widens nothing. With fewer than six values no two order
/// statistics cover 95%: low is the smallest and high the largest. All three 0 for no values.
struct MedianInterval {
    double median = 0;
    double low = 0;
    double high = 0;
    /// Half the interval's width over the median (0 when the median is not positive).
    double relativeHalfWidth() const { return median > 0 ? 0.5 * (high - low) / median : 0; }
};
MedianInterval medianInterval(std::vector<double> values);

/// What the decision claims per training batch, measured the way a user sees it: whole training
/// batches of the chosen size and of the largest, each a batch's samples over its time (the
/// optimizer step included), in turns. The search times micro-batches over a few seconds, and on
/// a shared machine one size's speed drifts against another's for seconds at a time (measured:
/// ±3-5% within ~5 s on 2 cores, docs/PERFORMANCE.md §6): a gain timed in one such stretch can be
/// gone in the next. Here every batch of the largest lies between two of the chosen size's; a
/// turn divides their mean by the largest's speed, and the median of the turns is the gain. The
/// first batch of the largest is a warm-up (its memory is laid out again after many of the smaller
/// size), not counted.
///
/// How many turns: at least `minTurns`; then until the gain is known to ±kPrecision (the 95%
/// interval of the median, MedianInterval), or the batches took `maxSeconds`, or kMaxTurns were
/// run. Where speeds hold still (a GPU of one's own) the minimum suffices; where one turn's ratio
/// spreads ±6% (the 64 px ResNet on a shared 2-core machine) nine turns know the gain to about
/// ±5% and the check goes on for the time it is given. The turns are `period` batches apart:
/// about kTurnSeconds each (less where `maxSeconds` would not hold `minTurns` of them), from the
/// first batch's time; at least every other batch, at most every kMaxPeriod + 1st. With
/// `maxBatches` (> 0) the check ends after that many batches, and its turns are short enough that
/// `minTurns` of them fit in it. A pure class, like the searches.
class BatchCheck {
public:
    static constexpr int kMaxPeriod = 32;
    static constexpr int kMaxTurns = 63;
    static constexpr double kTurnSeconds = 2.0;
    static constexpr double kPrecision = 0.02;

    BatchCheck(int64_t chosen, int64_t largest, int minTurns, double maxSeconds, int64_t maxBatches = 0);
    /// Batches the fewest turns need at the shortest period (one batch of the chosen size between
    /// two of the largest), the first and the largest's warm-up included.
    static int64_t batchesFor(int minTurns) { return 2 * static_cast<int64_t>(minTurns) + 3; }
    /// The size the next training batch should have (all its micro-batches).
    int64_t next() const;
    /// A whole training batch, every micro-batch of it `microBatch` (the size next() gave), ran at
    /// `samplesPerSecond` in `seconds`. A batch of another size is not counted.
    void observe(int64_t microBatch, double samplesPerSecond, double seconds);
    bool done() const;
    /// The chosen size's speed over the largest's: the median of the turns so far (0: none yet).
    double gain() const;
    /// That median with its 95% interval.
    MedianInterval interval() const { return medianInterval(m_ratios); }
    /// One ratio per finished turn, in order.
    const std::vector<double>& ratios() const { return m_ratios; }
    int64_t chosen() const { return m_chosen; }
    int64_t largest() const { return m_largest; }
    /// Batches of the chosen size between two of the largest (0 until the first batch ran).
    int period() const { return m_period; }
    /// The counted batches' own time so far, the warm-up's included.
    double seconds() const { return m_seconds; }
    /// Batches observed, each size.
    int batchesOf(int64_t microBatch) const { return microBatch == m_largest ? m_largestBatches : m_chosenBatches; }

private:
    int64_t m_chosen;
    int64_t m_largest;
    size_t m_minTurns;
    double m_maxSeconds;
    int64_t m_maxBatches;
    int m_period = 0;
    int m_sinceLargest = 0;    ///< batches of the chosen size since the last of the largest
    double m_lastChosen = 0;   ///< the speed of the chosen size's latest batch
    double m_before = 0;       ///< … of the one before the largest's batch whose turn is open
    double m_openLargest = 0;  ///< that batch's speed (0: no turn open)
    bool m_warmedUp = false;   ///< the largest's warm-up batch ran
    bool m_precise = false;    ///< the median is known to ±kPrecision
    double m_seconds = 0;
    int m_chosenBatches = 0;
    int m_largestBatches = 0;
    std::vector<double> m_ratios;
};

/// Watches training's throughput after a decision of the search (the option
/// probe.retime_every): the median samples/s of the first `everySteps` full training batches at
/// the chosen size is the baseline; the median of each following `everySteps` batches is
/// compared with it, and a change by more than `drift` either way (a neighbour's job started or
/// ended, clocks throttled) asks for the sizes to be timed again. Medians, so one slow step (a
/// checkpoint, a page fault) does not count as a drift. A pure class, like the searches.
class DriftWatch {
public:
    DriftWatch(int64_t everySteps, double drift);
    /// A full training batch at the chosen size ran at `samplesPerSecond`. Returns why the sizes
    /// should be timed again, in words with the numbers, once the window that ends here drifted.
    std::optional<std::string> observe(double samplesPerSecond);
    /// The baseline (0 until the first window is complete).
    double baseline() const { return m_baseline; }

private:
    int64_t m_every;
    double m_drift;
    double m_baseline = 0;
    std::vector<double> m_window;
};

/// What a training batch costs besides its micro-batches' own timed work (loading, forward,
/// backward): per micro-batch (choosing it, its event, a memory sample) and per batch (the
/// optimizer step, the step's reports; with several devices the wait for the others).
struct StepCosts {
    double perMicroBatchSeconds = 0;
    double perStepSeconds = 0;
};

/// Measures StepCosts on whole training batches: the median of the last `window` clean batches
/// (no probe trial, no failure, no batch trained again). A pure class, like the searches.
class StepCostWatch {
public:
    explicit StepCostWatch(size_t window = 8) : m_window(std::max<size_t>(1, window)) {}
    /// A clean batch of `microBatches` micro-batches whose own timings add up to `microSeconds`;
    /// the loop over them ended after `accumulateSeconds`, the whole batch (its step included)
    /// after `stepSeconds`.
    void observe(int64_t microBatches, double microSeconds, double accumulateSeconds, double stepSeconds);
    /// Zero costs before the first batch.
    StepCosts costs() const;
    bool measured() const { return !m_perStep.empty(); }

private:
    size_t m_window;
    std::vector<double> m_perMicroBatch;
    std::vector<double> m_perStep;
};

/// How much faster whole training batches of `target` samples run at micro-batch `size` than at
/// `largest`: each batch is ceil(target / n) micro-batches at their measured speed — `largest` at
/// `largestSamplesPerSecond`, `size` at `overLargest` times that (measured in turns) — plus
/// `costs` (per micro-batch, and per batch). A fixed per-batch cost shrinks the micro-batches'
/// gain; a per-micro-batch cost shrinks it further for the smaller size, which needs more of them.
/// 0 when a speed is unknown.
double stepSpeedOverLargest(int64_t target, int64_t size, int64_t largest, double largestSamplesPerSecond,
                            double overLargest, const StepCosts& costs);

/// The size that splits `target` into `parts` micro-batches (ceil(target / parts)), lowered to a
/// multiple of `multipleOf` and at least `smallest`: every candidate of a search is one.
int64_t evenSplitSize(int64_t target, int64_t parts, int64_t multipleOf, int64_t smallest);

/// Candidate sizes for a search: `largest`, then halvings, each lowered to ceil(target / k) for the
/// fewest micro-batches k it allows, and to a multiple of `multipleOf`; distinct, at least
/// `smallest`, largest first.
std::vector<int64_t> throughputCandidates(int64_t largest, int64_t target, int64_t multipleOf, int64_t smallest);

}  // namespace batchpilot::core
