// The trainer on several devices: this process is one rank of a data-parallel job
// (core/distributed/process_group.h). Each rank trains its share of every training batch with its own probed
// micro-batch and the whole batch's weights (size / batch), then the ranks sum their gradients
// once (a few flat buckets, all-reduced by Gloo) and take the same optimizer step. Nothing here
// runs inside a micro-batch: an OOM is recovered by the rank it happened on, with no collective
// involved, so it cannot leave the others waiting for a collective it never joins.

#include "core/config/run_config.h"
#include "core/train/trainer_impl.h"

#include <algorithm>
#include <utility>

namespace batchpilot::core {

namespace {

/// Gradient storage per all-reduce: a few large transfers, as PyTorch's DDP does (25 MiB).
constexpr int64_t kBucketBytes = int64_t{25} << 20;

/// What every rank must have the same of, or their steps would not fit together: the model's
/// shape, the data, the batch and the sampler.
std::string jobSignature(const std::vector<torch::Tensor>& parameters, int64_t dataSize, int64_t target, uint64_t seed,
                         int64_t step) {
    int64_t elements = 0;
    for (const auto& p : parameters) elements += p.numel();
    return std::to_string(parameters.size()) + " parameter tensors of " + std::to_string(elements) + " values, " +
           std::to_string(dataSize) + " training samples, target batch " + std::to_string(target) + ", seed " +
           std::to_string(seed) + ", step " + std::to_string(step);
}

/// FNV-1a over the parameters' bytes: equal on two ranks exactly when their parameters are
/// (but for a collision), which is what "every rank steps identically" promises.
uint64_t parameterChecksum(const std::vector<torch::Tensor>& parameters) {
    torch::NoGradGuard noGrad;
    CountingScope host(false);
    uint64_t hash = 14695981039346656037ULL;
    for (const auto& p : parameters) {
        const torch::Tensor values = p.detach().to(torch::kCPU).contiguous();
        const auto* bytes = static_cast<const unsigned char*>(values.data_ptr());
        const auto count = static_cast<size_t>(values.numel()) * values.element_size();
        for (size_t i = 0; i < count; ++i) {
            hash ^= bytes[i];
            hash *= 1099511628211ULL;
        }
    }
    return hash;
}

std::string collectiveError(const std::string& text) {
    const auto end = text.find('\n');
    return end == std::string::npos ? text : text.substr(0, end);
}

/// The numbers each rank contributes to a step's exchange, in this order.
enum StepField : size_t {
    kFieldShare,
    kFieldCompute,
    kFieldLargest,
    kFieldCommitted,
    kFieldPeak,
    kFieldOoms,
    kFieldSettled,
    kFieldProbed,
    kFieldLoss,
    kFieldReports,
    kStepFields
};

/// Rank `rank`'s part of a step's RanksStepped, from the kStepFields numbers it sent; `slowest`:
/// the compute time of the slowest rank.
RankStep rankStepOf(const double* sent, int rank, const std::string& device, double slowest) {
    RankStep step;
    step.rank = rank;
    step.device = device;
    step.share = static_cast<int64_t>(sent[kFieldShare]);
    step.microBatch = static_cast<int64_t>(sent[kFieldLargest]);
    step.microBatches = static_cast<int64_t>(sent[kFieldCommitted]);
    step.computeSeconds = sent[kFieldCompute];
    step.samplesPerSecond = step.computeSeconds > 0 ? static_cast<double>(step.share) / step.computeSeconds : 0;
    // Every rank starts the batch together (after the last exchange) and waits at this one
    // until the slowest is done.
    step.waitSeconds = slowest - step.computeSeconds;
    step.peakBytes = static_cast<int64_t>(sent[kFieldPeak]);
    step.ooms = static_cast<int>(sent[kFieldOoms]);
    step.settled = sent[kFieldSettled] != 0;
    return step;
}

/// The indices, in the model's buffers, of BatchNorm's running statistics (ParallelState::statistics).
std::vector<size_t> runningStatistics(const Model& model) {
    const std::vector<std::string> names = model.bufferNames();
    const std::vector<torch::Tensor> buffers = model.buffers();
    std::vector<size_t> statistics;
    for (size_t i = 0; i < buffers.size() && i < names.size(); ++i) {
        const std::string& name = names[i];
        const auto endsWith = [&](const std::string& tail) {
            return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
        };
        if (buffers[i].is_floating_point() && (endsWith("running_mean") || endsWith("running_var")))
            statistics.push_back(i);
    }
    return statistics;
}

}  // namespace

void Trainer::Impl::refuseWhatRanksCannotDo(int world) const {
    if (options.stepMode) {
        throw badInput(
            "step-by-step mode shows one process's micro-batches; it is not available with several "
            "devices: train on one device to step through a batch",
            "configuration");
    }
    if (progress.target < world * choice.sizes().minPart) {
        throw badInput("the target batch " + std::to_string(progress.target) + " cannot be shared by " +
                           std::to_string(world) + " devices" +
                           (choice.sizes().minPart > 1
                                ? " at " + std::to_string(choice.sizes().minPart) + " samples each (BatchNorm)"
                                : "") +
                           ": choose a target batch of at least " + std::to_string(world * choice.sizes().minPart) +
                           ", or fewer devices",
                       "configuration");
    }
}

void Trainer::Impl::setupParallel() {
    ParallelState state;
    state.link = options.parallel;
    ProcessGroupLink& link = *state.link;
    // Before joining: every rank refuses alike, none waits for another.
    if (const std::string problem = ProcessGroupLink::collectivesProblem(); !problem.empty())
        throw badInput(problem, "configuration");
    if (auto connected = link.connect(); !connected) throw badInput(connected.error(), "configuration");
    const int world = link.size();
    refuseWhatRanksCannotDo(world);
    try {
        state.devices = link.exchangeText("device", hardware.device.name());
        state.places = link.exchangeText("nccl", link.ncclPlace());
        // Ranks that built another model, loaded other data or resumed elsewhere cannot add up
        // their gradients: say which, before anything is trained.
        const std::vector<std::string> signatures = link.exchangeText(
            "job",
            jobSignature(learner.parameters, feed.training->size(), progress.target, options.seed, progress.step));
        for (int r = 1; r < world; ++r) {
            if (signatures[static_cast<size_t>(r)] != signatures[0]) {
                throw badInput(rankName(r, state.devices) + " does not train the same job as rank 0: it has " +
                                   signatures[static_cast<size_t>(r)] + ", rank 0 has " + signatures[0] +
                                   "; start every rank with the same model, data and options",
                               "configuration");
            }
        }
        // One start for all: rank 0's parameters and buffers (a model initialised from the seed
        // is the same everywhere already; this also covers models whose loading is not).
        {
            torch::NoGradGuard noGrad;
            CountingScope inPlace(false);
            std::vector<torch::Tensor> values;
            for (const auto& p : learner.parameters) values.push_back(p.detach());
            for (const auto& b : learner.model->buffers()) values.push_back(b.detach());
            link.broadcast(values, 0);
        }
        // First shares: by each device's usable memory; the probed micro-batches and the
        // measured speeds refine them (finishRanksStep).
        const std::vector<double> usable = link.allGather({static_cast<double>(usableBytes())});
        state.shares = options.balanceShares ? splitShares(progress.target, usable, choice.sizes().minPart)
                                             : splitShares(progress.target, std::vector<double>(usable.size(), 1.0),
                                                           choice.sizes().minPart);
    } catch (const FatalError&) {
        throw;
    } catch (const std::exception& e) {
        parallel = std::move(state);  // ranksFailed names the devices
        ranksFailed(e, "joining the other ranks");
    }
    ShareBalancer::Options balance;
    balance.minShare = choice.sizes().minPart;
    state.balancer.emplace(balance);
    state.statistics = runningStatistics(*learner.model);
    parallel = std::move(state);
    bucketGradients();
    chooseRankCollectives();
    // Every rank probes its own device, whatever a checkpoint says the micro-batch was.
    choice.forgetSizes();
}

void Trainer::Impl::bucketGradients() {
    // The old accumulators go first (also as the parameters' .grad): the buckets take their
    // place in memory.
    parallel->buckets.clear();
    learner.gradients.clear();
    linkGradients();
    learner.gradients.resize(learner.parameters.size());
    for (size_t i = 0; i < learner.parameters.size();) {
        size_t end = i;
        int64_t elements = 0;
        const auto itemBytes = static_cast<int64_t>(learner.parameters[i].element_size());
        while (end < learner.parameters.size() && learner.parameters[end].dtype() == learner.parameters[i].dtype() &&
               learner.parameters[end].device() == learner.parameters[i].device() &&
               (end == i || (elements + learner.parameters[end].numel()) * itemBytes <= kBucketBytes)) {
            elements += learner.parameters[end].numel();
            ++end;
        }
        torch::Tensor bucket = torch::zeros(
            {elements},
            torch::TensorOptions().dtype(learner.parameters[i].dtype()).device(learner.parameters[i].device()));
        int64_t offset = 0;
        for (size_t k = i; k < end; ++k) {
            learner.gradients[k] =
                bucket.narrow(0, offset, learner.parameters[k].numel()).view(learner.parameters[k].sizes());
            offset += learner.parameters[k].numel();
        }
        parallel->buckets.push_back(bucket);
        i = end;
    }
    linkGradients();
}

void Trainer::Impl::chooseRankCollectives() {
    const CollectivesChoice choice = chooseCollectives(parallel->devices, parallel->places);
    if (!choice.nccl && ProcessGroupLink::ncclRequired()) {
        throw badInput("BATCHPILOT_COLLECTIVES=nccl, but NCCL cannot sum this job's gradients: " + choice.why +
                           "; unset BATCHPILOT_COLLECTIVES (or set it to gloo) to sum them with Gloo",
                       "configuration");
    }
    parallel->collectivesWhy = choice.why;
    try {
        parallel->link->useNccl(choice.nccl);
        if (choice.nccl) {
            torch::NoGradGuard noGrad;
            parallel->link->allReduceSum(parallel->buckets);
        }
    } catch (const std::exception& e) {
        ranksFailed(e, choice.nccl ? "starting NCCL" : "leaving NCCL");
    }
}

/// One rank's vote at a batch boundary (ranksAgree): what it was asked for since the last one.
struct trainer_detail::RankVote {
    bool stop = false;
    std::optional<std::pair<int64_t, LrScaling>> target;  ///< a new target batch and its rule
    bool pause = false;
    std::optional<MemorySavers> savers;  ///< never Auto
    bool survey = false;                 ///< a survey of the memory savers
    bool switching = false;              ///< device switches (ParallelState::requestedDevices)
    std::optional<int64_t> equivalence;  ///< an equivalence check: its samples (0: the whole batch)

    /// As the ranks exchange it: kNumbers numbers (0: not asked; a value + 1 where 0 is one).
    static constexpr size_t kNumbers = 8;
    std::vector<double> numbers() const {
        return {stop ? 1.0 : 0.0,
                target ? static_cast<double>(target->first) : 0.0,
                target ? static_cast<double>(static_cast<int>(target->second)) : 0.0,
                pause ? 1.0 : 0.0,
                savers ? static_cast<double>(static_cast<int>(*savers) + 1) : 0.0,
                survey ? 1.0 : 0.0,
                switching ? 1.0 : 0.0,
                equivalence ? static_cast<double>(*equivalence + 1) : 0.0};
    }
    static RankVote from(const double* n) {
        RankVote v;
        v.stop = n[0] != 0;
        if (n[1] > 0) v.target = {static_cast<int64_t>(n[1]), static_cast<LrScaling>(static_cast<int>(n[2]))};
        v.pause = n[3] != 0;
        if (const int savers = static_cast<int>(n[4]) - 1; savers >= 0 && savers < static_cast<int>(MemorySavers::Auto))
            v.savers = static_cast<MemorySavers>(savers);
        v.survey = n[5] != 0;
        v.switching = n[6] > 0;
        if (n[7] > 0) v.equivalence = static_cast<int64_t>(n[7]) - 1;
        return v;
    }
};

std::vector<RankVote> Trainer::Impl::gatherVotes(bool stopHere) {
    RankVote mine;
    mine.stop = stopHere;
    mine.target = std::exchange(parallel->requestedTarget, std::nullopt);
    mine.pause = commands.pauseRequested();
    mine.savers = std::exchange(parallel->requestedSavers, std::nullopt);
    mine.survey = std::exchange(parallel->surveyRequested, false);
    mine.switching = !parallel->requestedDevices.empty();
    mine.equivalence = std::exchange(parallel->requestedEquivalence, std::nullopt);
    std::vector<double> numbers;
    try {
        numbers = parallel->link->allGather(mine.numbers());
    } catch (const std::exception& e) {
        ranksFailed(e, "agreeing on the next batch");
    }
    std::vector<RankVote> votes;
    for (size_t at = 0; at + RankVote::kNumbers <= numbers.size(); at += RankVote::kNumbers)
        votes.push_back(RankVote::from(numbers.data() + at));
    return votes;
}

bool Trainer::Impl::ranksAgree(bool stopHere) {
    const std::vector<RankVote> votes = gatherVotes(stopHere);
    parallel->pausingRanks.clear();
    for (size_t r = 0; r < votes.size(); ++r)
        if (votes[r].pause) parallel->pausingRanks.push_back(static_cast<int>(r));
    for (size_t r = 0; r < votes.size(); ++r) {
        if (!votes[r].stop) continue;
        if (!stopHere) {
            parallel->stoppedByRanks = true;
            emit(Warning{now(), rankName(static_cast<int>(r), parallel->devices) +
                                    " asked to stop: every rank stops after step " + std::to_string(progress.step)});
        }
        parallel->requestedDevices.clear();
        return true;
    }
    // The lowest asking rank's word, for each kind of request.
    const auto first = [&](auto asked) {
        return std::find_if(votes.begin(), votes.end(), [&](const RankVote& v) { return asked(v); });
    };
    // Checked before the changes below change the micro-batch plans it compares against.
    if (auto v = first([](const RankVote& v) { return v.equivalence.has_value(); }); v != votes.end())
        checkEquivalence(*v->equivalence);
    if (auto v = first([&](const RankVote& v) { return v.target && v.target->first != progress.target; });
        v != votes.end())
        agreeOnTarget(*v->target);
    if (auto v = first([](const RankVote& v) { return v.savers.has_value(); }); v != votes.end()) {
        // Every rank changes its savers and probes again within its share; once every rank has
        // probed, the shares follow the new micro-batches (as at the start).
        // (Decided on every rank alike, whether or not the savers are available on its device.)
        const auto r = static_cast<int>(v - votes.begin());
        parallel->sharedByCapacity = false;
        parallel->balancer->reset();
        applySavers(*v->savers,
                    "asked for on " + rankName(r, parallel->devices) + ", applied by every rank at the same batch");
    }
    if (first([](const RankVote& v) { return v.switching; }) != votes.end()) switchRanks();
    if (auto v = first([](const RankVote& v) { return v.survey; }); v != votes.end()) {
        // Every rank measures the savers on its own device, within its own share, side by side;
        // each reports its own table (rank 0's is the app's). Applying one is a vote of its own.
        surveySavers("asked for on " + rankName(static_cast<int>(v - votes.begin()), parallel->devices));
    }
    return false;
}

void Trainer::Impl::agreeOnTarget(const std::pair<int64_t, LrScaling>& asked) {
    const int world = parallel->link->size();
    if (asked.first < world * choice.sizes().minPart) {
        emit(Warning{now(), "target batch " + std::to_string(asked.first) + " ignored: " + std::to_string(world) +
                                " devices need at least " + std::to_string(world * choice.sizes().minPart) +
                                " samples; training continues at " + std::to_string(progress.target)});
        return;
    }
    // The shares keep their proportions; each rank probes again within its new share.
    parallel->shares = scaleShares(parallel->shares, asked.first, choice.sizes().minPart);
    parallel->balancer->reset();
    changeTarget(asked.first, asked.second);
}

bool Trainer::Impl::learnRankDevices(const std::vector<std::string>& outcome) {
    const int me = parallel->link->rank();
    bool moved = false;
    for (size_t r = 0; r < outcome.size(); ++r) {
        const nlohmann::json said = nlohmann::json::parse(outcome[r], nullptr, false);
        if (!said.is_object() || !said.contains("device") || !said["device"].is_string()) continue;
        const std::string current = said["device"].get<std::string>();
        const std::string from = parallel->devices[r];
        if (current != from) {
            moved = true;
            parallel->devices[r] = current;
            if (me == 0 && r != 0) emit(DeviceSwitched{now(), from, current, static_cast<int>(r)});
        } else if (me == 0 && r != 0 && said.contains("refused") && said["refused"].is_string() &&
                   !said["refused"].get<std::string>().empty()) {
            emit(Warning{now(), "rank " + std::to_string(r) + " stays on " + from +
                                    ": its device switch was refused: " + said["refused"].get<std::string>()});
        }
    }
    return moved;
}

void Trainer::Impl::switchRanks() {
    ProcessGroupLink& link = *parallel->link;
    const int me = link.rank();
    const std::string round = std::to_string(++parallel->switches);
    // The switches each rank was asked for, by the rank that is to move.
    nlohmann::json mine = nlohmann::json::object();
    for (const auto& [rank, spec] : std::exchange(parallel->requestedDevices, {})) mine[std::to_string(rank)] = spec;
    std::vector<std::string> asked;
    try {
        asked = link.exchangeText("switch/" + round, jsonText(mine));
    } catch (const std::exception& e) {
        ranksFailed(e, "agreeing on a device switch");
    }
    // This rank's new device: the last asking rank's word for it, in rank order.
    // (Each asking rank kept only ranks of the job: applyCommands.)
    std::optional<std::string> spec;
    for (const std::string& text : asked) {
        const nlohmann::json said = nlohmann::json::parse(text, nullptr, false);
        if (said.is_object() && said.contains(std::to_string(me)) && said[std::to_string(me)].is_string())
            spec = said[std::to_string(me)].get<std::string>();
    }
    std::string refused;
    const std::string before = hardware.device.name();
    if (spec) {
        if (auto next = parseDevice(*spec); !next) {
            refused = next.error();
        } else if (next->name() == before) {
            spec.reset();  // already there
        } else if (std::optional<std::string> why = switchTo(*next)) {
            refused = *why;
        }
        if (!refused.empty()) emit(Warning{now(), "device switch to " + *spec + " refused: " + refused});
    }
    // Every rank learns where each rank is now (or why one stayed), rank 0 reports it.
    std::vector<std::string> outcome;
    try {
        outcome = link.exchangeText("switched/" + round,
                                    jsonText(nlohmann::json{{"device", hardware.device.name()}, {"refused", refused}}));
    } catch (const std::exception& e) {
        ranksFailed(e, "agreeing on a device switch");
    }
    const bool moved = learnRankDevices(outcome);
    if (moved) {
        // As at the start: once every rank has probed, the shares follow the micro-batches.
        parallel->sharedByCapacity = false;
        parallel->balancer->reset();
        chooseRankCollectives();  // NCCL's communicator knows the GPUs it was made for
    }
}

std::optional<int64_t> Trainer::Impl::agreeOnEquivalence(std::optional<int64_t> mine, bool stopped) {
    // Every rank joins, stopped or not (a stop asked for during the last batch reaches one rank
    // only): the check runs when a rank asked for it and none was stopped.
    std::vector<double> all;
    try {
        all = parallel->link->allGather({mine ? static_cast<double>(*mine + 1) : 0.0, stopped ? 1.0 : 0.0});
    } catch (const std::exception& e) {
        ranksFailed(e, "agreeing on an equivalence check at the end");
    }
    std::optional<int64_t> asked;
    for (size_t r = 0; r * 2 < all.size(); ++r) {
        if (all[r * 2 + 1] != 0) return std::nullopt;
        if (!asked && all[r * 2] > 0) asked = static_cast<int64_t>(all[r * 2]) - 1;
    }
    return asked;
}

bool Trainer::Impl::holdWhilePaused() {
    if (parallel->pausingRanks.empty()) return false;
    const std::vector<int> pausing = std::exchange(parallel->pausingRanks, {});
    // Named by the pause's number: every rank counts the same agreed pauses.
    const std::string key = "resumed/" + std::to_string(++parallel->pauses) + "/";
    ProcessGroupLink& link = *parallel->link;
    const int me = link.rank();
    if (std::find(pausing.begin(), pausing.end(), me) != pausing.end()) {
        // Resumed or stopped: either way the others go on to the next vote (which sees a stop).
        waitWhilePaused();
        link.markDone(key + std::to_string(me));
    }
    const RunState previous = progress.state;
    bool waited = false;
    for (const int r : pausing) {
        if (r == me) continue;
        if (!waited) {
            setState(RunState::Paused, rankName(r, parallel->devices) + " paused the run: every rank waits for it");
            waited = true;
        }
        try {
            link.waitWhileAlive(key + std::to_string(r), r);
        } catch (const std::exception& e) {
            ranksFailed(e, "waiting for rank " + std::to_string(r) + "'s pause to end");
        }
    }
    if (waited) setState(previous);
    return true;
}

std::vector<int64_t> Trainer::Impl::rankSlice(const std::vector<int64_t>& batch) const {
    const auto total = static_cast<int64_t>(batch.size());
    // The end of an epoch: a shorter batch, split in the same proportions.
    const std::vector<int64_t> shares =
        total == progress.target ? parallel->shares : scaleShares(parallel->shares, total, choice.sizes().minPart);
    const int rank = parallel->link->rank();
    const int64_t offset = shareOffset(shares, rank);
    return {batch.begin() + offset, batch.begin() + offset + shares[static_cast<size_t>(rank)]};
}

double Trainer::Impl::reduceOverRanks(double lossSum, int64_t share, int64_t largestUsed, int64_t committed,
                                      int64_t peak, double computeSeconds, bool settled) {
    std::vector<double> mine(kStepFields, 0.0);
    mine[kFieldShare] = static_cast<double>(share);
    mine[kFieldCompute] = computeSeconds;
    mine[kFieldLargest] = static_cast<double>(largestUsed);
    mine[kFieldCommitted] = static_cast<double>(committed);
    mine[kFieldPeak] = static_cast<double>(peak);
    mine[kFieldOoms] = parallel->oomsInStep;
    mine[kFieldSettled] = settled ? 1.0 : 0.0;
    // 0 while a probe runs: the shares follow the micro-batches once every rank's probe ended.
    mine[kFieldProbed] = choice.probing() ? 0.0 : static_cast<double>(choice.sizes().probed);
    mine[kFieldLoss] = lossSum;
    mine[kFieldReports] = static_cast<double>(parallel->unreported.size());
    double reduceSeconds = 0;
    std::vector<std::string> reports;
    const std::vector<double> all = sumOverRanks(mine, share, reduceSeconds, reports);
    parallel->unreported.clear();
    if (leads()) showRankReports(reports);
    return recordRanksStep(all, reduceSeconds);
}

std::vector<double> Trainer::Impl::sumOverRanks(const std::vector<double>& mine, int64_t share, double& reduceSeconds,
                                                std::vector<std::string>& reports) {
    ProcessGroupLink& link = *parallel->link;
    std::vector<double> all;
    const auto field = [&](size_t rank, StepField f) { return all[rank * kStepFields + f]; };
    const auto world = static_cast<size_t>(link.size());
    try {
        all = link.allGather(mine);
        const auto reduceStart = Clock::now();
        {
            torch::NoGradGuard noGrad;
            CountingScope inPlace(false);
            link.allReduceSum(parallel->buckets);
            // Every rank's BatchNorm running statistics, averaged as weighted by its share.
            double total = 0;
            for (size_t r = 0; r < world; ++r) total += field(r, kFieldShare);
            if (!parallel->statistics.empty() && total > 0) {
                const std::vector<torch::Tensor> buffers = learner.model->buffers();
                std::vector<torch::Tensor> weighted;
                for (const size_t i : parallel->statistics) weighted.push_back(buffers[i] * (share / total));
                link.allReduceSum(weighted);
                for (size_t k = 0; k < weighted.size(); ++k) buffers[parallel->statistics[k]].copy_(weighted[k]);
            }
        }
        reduceSeconds = std::chrono::duration<double>(Clock::now() - reduceStart).count();
        // The other ranks' probes and OOMs, for rank 0 to show: only in the steps that had any
        // (every rank decides so from the same numbers).
        bool anyReports = false;
        for (size_t r = 1; r < world; ++r) anyReports = anyReports || field(r, kFieldReports) > 0;
        if (anyReports) {
            reports = link.exchangeText("probe_events/" + std::to_string(++parallel->reportExchanges),
                                        rankReportText(parallel->unreported, now()));
        }
    } catch (const std::exception& e) {
        ranksFailed(e, "summing the gradients");
    }
    return all;
}

void Trainer::Impl::showRankReports(const std::vector<std::string>& reports) {
    for (size_t r = 1; r < reports.size(); ++r) {
        auto report = readRankReport(reports[r], now());
        if (!report) {
            emit(Warning{now(), rankName(static_cast<int>(r), parallel->devices) +
                                    " sent a probe report that cannot be read (" + report.error() +
                                    "); its probes are not shown, training goes on"});
            continue;
        }
        if (report->probes.empty() && report->trials.empty() && report->finished.empty() && report->ooms.empty())
            continue;
        report->time = now();
        report->rank = static_cast<int>(r);
        report->device = parallel->devices[r];
        emit(std::move(*report));
    }
}

double Trainer::Impl::recordRanksStep(const std::vector<double>& all, double reduceSeconds) {
    ProcessGroupLink& link = *parallel->link;
    const auto field = [&](size_t rank, StepField f) { return all[rank * kStepFields + f]; };
    const auto world = static_cast<size_t>(link.size());
    double slowest = 0;
    double fastest = 0;  // of the ranks that had samples: one without waits for nothing
    double totalLoss = 0;
    for (size_t r = 0; r < world; ++r) {
        const double compute = field(r, kFieldCompute);
        slowest = std::max(slowest, compute);
        if (field(r, kFieldShare) > 0) fastest = fastest == 0 ? compute : std::min(fastest, compute);
        totalLoss += field(r, kFieldLoss);
    }
    RanksStepped& report = parallel->report;
    report = RanksStepped{};
    report.step = progress.step + 1;
    report.allReduceSeconds = reduceSeconds;
    report.collectives = link.collectives();
    report.collectivesWhy = parallel->collectivesWhy;
    std::vector<RankStepTiming> timings;
    bool fullBatch = true;
    bool everyRankProbed = true;
    bool anyCapped = false;
    for (size_t r = 0; r < world; ++r) {
        RankStep rank = rankStepOf(all.data() + r * kStepFields, static_cast<int>(r), parallel->devices[r], slowest);
        timings.push_back({rank.share, rank.computeSeconds, rank.settled});
        fullBatch = fullBatch && rank.share == parallel->shares[r];
        const auto probed = static_cast<int64_t>(field(r, kFieldProbed));
        everyRankProbed = everyRankProbed && probed > 0;
        anyCapped = anyCapped || probed >= parallel->shares[r];  // the share, not the memory, limited it
        report.ranks.push_back(std::move(rank));
    }
    // The decisions below are taken by every rank from the same numbers: the same on all.
    if (fullBatch && options.balanceShares) {
        if (!parallel->sharedByCapacity && everyRankProbed) {
            parallel->sharedByCapacity = true;
            if (!anyCapped) {
                std::vector<double> capacity;
                for (size_t r = 0; r < world; ++r) capacity.push_back(field(r, kFieldProbed));
                std::vector<int64_t> next = splitShares(progress.target, capacity, choice.sizes().minPart);
                if (next != parallel->shares) {
                    report.nextShares = std::move(next);
                    report.shareReason = "in proportion to each device's probed micro-batch";
                }
            }
        } else if (auto change = parallel->balancer->observe(timings, parallel->shares, progress.target)) {
            report.nextShares = std::move(change->shares);
            report.shareReason = std::move(change->reason);
        }
    }
    report.imbalance = fastest > 0 ? slowest / fastest : 0;
    return totalLoss;
}

void Trainer::Impl::finishRanksStep() {
    RanksStepped& report = parallel->report;
    if (options.parameterCheckEvery > 0 && progress.step % options.parameterCheckEvery == 0) {
        checkRanksAgree();
        report.parametersChecked = true;
    }
    report.time = now();
    const int64_t before = localTarget();
    if (!report.nextShares.empty()) {
        parallel->shares = report.nextShares;
        parallel->balancer->reset();
    }
    emit(report);
    const int64_t after = localTarget();
    // A share beyond the size the last probe could try (it was bounded by the old share): probe
    // again from the size in use, so the larger share does not run in needlessly small parts.
    if (after > before && !choice.probing() && choice.sizes().probed >= before) {
        startProbe(ProbeReason::TargetBatchChange, choice.sizes().microBatch, choice.sizes().microBatch);
    }
}

void Trainer::Impl::awaitValidation() {
    try {
        parallel->link->waitWhileAlive("validated/" + std::to_string(progress.step), 0);
    } catch (const std::exception& e) {
        ranksFailed(e, "waiting for rank 0's validation after step " + std::to_string(progress.step));
    }
    feed.validation.lastStep = progress.step;
    feed.validation.epochs = feed.sampler->completedEpochs();
}

void Trainer::Impl::checkRanksAgree() {
    if (parallel->lastCheckedStep == progress.step) return;
    parallel->lastCheckedStep = progress.step;
    const uint64_t hash = parameterChecksum(learner.parameters);
    std::vector<double> all;
    try {
        // Two exact halves: a double holds any 32-bit number.
        all = parallel->link->allGather({static_cast<double>(hash >> 32), static_cast<double>(hash & 0xffffffffULL)});
    } catch (const std::exception& e) {
        ranksFailed(e, "comparing the parameters");
    }
    std::string differing;
    for (size_t r = 1; r * 2 < all.size(); ++r) {
        if (all[r * 2] == all[0] && all[r * 2 + 1] == all[1]) continue;
        if (!differing.empty()) differing += ", ";
        differing += rankName(static_cast<int>(r), parallel->devices);
    }
    if (!differing.empty()) {
        throw FatalError{"after step " + std::to_string(progress.step) + " the parameters of " + differing +
                             " differ from rank 0's, though every rank took the same optimizer step on the same "
                             "summed gradients: the ranks must run the same LibTorch build on the same kind of "
                             "device for bit-identical steps; resume from the last checkpoint",
                         "step " + std::to_string(progress.step) + ", comparing the ranks' parameters"};
    }
}

void Trainer::Impl::ranksFailed(const std::exception& error, const std::string& during) {
    const std::string where = "step " + std::to_string(progress.step + 1) + ", " + during;
    const std::string lost =
        "the ranks lost each other at step " + std::to_string(progress.step + 1) + " (" + during + "): ";
    const std::string resume = "; the last checkpoint resumes the job, with the same or other devices";
    // A rank that failed said why before it left: its reason, not the transport's.
    if (const std::string failed = parallel->link->failedRanks(parallel->devices); !failed.empty())
        throw FatalError{lost + failed + resume, where, true};
    const std::string missing = parallel->link->unresponsiveRanks(parallel->devices);
    throw FatalError{lost +
                         (missing.empty() ? std::string("another rank failed (see its message)")
                                          : missing + " stopped answering (it died or hangs)") +
                         " [" + collectiveError(error.what()) + "]" + resume,
                     where, true};
}

}  // namespace batchpilot::core
