#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tl/expected.hpp>

/// Run options. Plain structs with defaults in the declarations; the CLI, the GUI and tests fill
/// them in. Units: samples for batch sizes, fractions (0..1) for headroom. What a user can set,
/// with its key, flag and range, is declared in core/config/option_schema.cpp.
namespace batchpilot::core {

class Model;
class Dataset;
class ProcessGroupLink;

/// Optimizer steps of a run that names neither steps nor epochs (the CLI and configuration files).
inline constexpr int64_t kDefaultSteps = 100;

enum class OptimizerKind { Sgd, Adam, AdamW };
enum class LrScaling { None, Linear, Sqrt };
enum class NormKind { Group, Batch };
/// Training loss: cross-entropy over class logits [N, classes] (classification) or mean squared
/// error against float targets of the output's shape (regression). See core/nn/loss.h.
enum class LossKind { CrossEntropy, Mse };
/// What the probe optimises once it knows the largest micro-batch that fits: the measured
/// throughput (core/plan/throughput_search.h) or the size itself.
enum class ProbeObjective { Fastest, Largest };
/// What training may trade for device memory (issue 15, core/config/memory_savers.h): activation
/// checkpointing (recompute in backward: ~1 more forward pass), bfloat16 autocast (the forward's
/// matrix products in bfloat16: half the activation bytes, ~3 significant digits), both;
/// float16 autocast with dynamic loss scaling (fp16: the same bytes as bfloat16, ~3.3 digits
/// but a range that ends at 65504, for GPUs without fast bfloat16), with checkpointing too
/// (checkpoint-fp16); or auto: the one the survey measured fastest when the micro-batch is small
/// or nothing fits.
enum class MemorySavers { Off, Checkpoint, Bf16, Both, Fp16, CheckpointFp16, Auto };

const char* toString(OptimizerKind kind);
const char* toString(LrScaling rule);
const char* toString(NormKind kind);
const char* toString(LossKind kind);
const char* toString(ProbeObjective objective);
const char* toString(MemorySavers savers);
tl::expected<OptimizerKind, std::string> parseOptimizerKind(const std::string& text);
tl::expected<LrScaling, std::string> parseLrScaling(const std::string& text);
tl::expected<NormKind, std::string> parseNormKind(const std::string& text);
tl::expected<LossKind, std::string> parseLossKind(const std::string& text);
tl::expected<ProbeObjective, std::string> parseProbeObjective(const std::string& text);
tl::expected<MemorySavers, std::string> parseMemorySavers(const std::string& text);

/// The learning rate an optimizer gets when none is given: 0.05 for SGD with momentum, and
/// PyTorch's own default, 0.001, for Adam and AdamW (0.05 made Adam's loss diverge within two
/// steps on the built-in MLP).
double defaultLearningRate(OptimizerKind kind);
/// Whether `rate` is one of the optimizers' defaults (not a rate someone chose).
bool isDefaultLearningRate(double rate);

struct OptimizerOptions {
    OptimizerKind kind = OptimizerKind::Sgd;
    double learningRate = defaultLearningRate(OptimizerKind::Sgd);  ///< defaultLearningRate(kind) unless given
    double momentum = 0.9;                                          ///< SGD only
    double weightDecay = 0.0;                                       ///< L2 for SGD and Adam, decoupled for AdamW
    double beta1 = 0.9;
    double beta2 = 0.999;
    double epsilon = 1e-8;
};

/// How the largest micro-batch is searched for. See probe_search.h.
struct ProbeOptions {
    int64_t initialMicroBatch = 1;  ///< first size tried
    double headroom = 0.05;         ///< fraction of capacity kept free (0..0.9)
    int64_t multipleOf = 1;         ///< round the result down to a multiple (e.g. 8)
    int64_t maxMicroBatch = 0;      ///< 0: no limit besides the target batch and the dataset
    int maxTrials = 24;
    double tolerance = 0.02;  ///< stop when the bracket is within this fraction (or adjacent)
    /// Fastest: after the memory search, time smaller sizes on real training micro-batches and
    /// keep the fastest (ties go to the larger). Largest: the largest size that fits.
    ProbeObjective objective = ProbeObjective::Fastest;
    /// Fastest only: after each decision, every this many full training batches compare the
    /// throughput with the one measured right after the decision, and time the sizes again when
    /// it drifted by more than `retimeDrift` either way (DriftWatch, core/plan/throughput_search.h);
    /// 0: never (the default: a re-probe, device switch, target change or regrow times again anyway).
    int64_t retimeEvery = 0;
    double retimeDrift = 0.15;  ///< relative change in samples/s, e.g. 0.15 for ±15%
    /// Fastest only: a size below the largest is kept only after whole training batches of the
    /// two, timed in turns, show it faster; what they measure is the gain the decision claims
    /// (BatchCheck, core/plan/throughput_search.h). The turns go on until the gain is known to
    /// ±2%, for at most about this many seconds once the fewest (nine) ran. 0: not checked (the
    /// claim is then computed from the micro-batches' timings).
    double checkSeconds = 60;
};

/// Names of the built-in models ("mlp", "cnn", "resnet"), for help texts and GUI lists.
std::vector<std::string> builtinModelNames();
/// True when `name` means a TorchScript file rather than a built-in model: it ends in .pt or
/// .pth, or names an existing file.
bool isModelFile(const std::string& name);
/// Names of the data sets ("synthetic", "mnist", "image-folder", "csv").
std::vector<std::string> datasetNames();
/// "a, b or c": a list of names for a message.
std::string choiceList(const std::vector<std::string>& names);

struct ModelOptions {
    std::string name = "cnn";         ///< "mlp", "cnn", "resnet", or a TorchScript file (.pt/.pth)
    NormKind norm = NormKind::Group;  ///< normalisation layers of the ResNet-style model
    int64_t width = 32;               ///< channels of the first stage / hidden units scale
};

/// Which data to train on. "synthetic" uses samples, classes and the image size; "mnist",
/// "image-folder" and "csv" read `path` (see core/data/dataset.h for each format). The image size
/// (channels, height, width) is also what "image-folder" resizes to.
struct DataOptions {
    std::string name = "synthetic";  ///< "synthetic", "mnist", "image-folder" or "csv"
    int64_t samples = 4096;          ///< dataset size (synthetic only)
    int64_t channels = 3;            ///< synthetic and image-folder: 3 (RGB) or 1 (grey)
    int64_t height = 32;
    int64_t width = 32;
    int64_t classes = 10;  ///< synthetic only; file datasets count their classes
    uint64_t seed = 1;
    std::string path;          ///< MNIST folder, image-folder root or CSV file
    std::string targetColumn;  ///< CSV: the column holding the label or value
    bool regression = false;   ///< CSV: float targets [N, 1] for MSE instead of class ids (resolve sets it)
    /// image-folder: decoded images are kept in host memory up to this many bytes; a larger
    /// folder is decoded again from disk in each get().
    int64_t imageCacheBytes = int64_t{1} << 30;
};

/// The share of the data held out for validation when none is given (core/train/validation.h).
inline constexpr double kDefaultValidationSplit = 0.1;

/// Held-out data and when it is evaluated (core/train/validation.h, trainer_validation.cpp).
struct ValidationOptions {
    /// Share of the data held out, 0 to 0.9, drawn from data.seed alone (the same samples for any
    /// run seed). nullopt: kDefaultValidationSplit, except for data given by a DatasetFactory
    /// (tests), which is not split unless asked. Synthetic data gets that share of extra samples
    /// of its own instead. 0: no validation.
    std::optional<double> split;
    /// A second data set in the training data's format (e.g. MNIST's t10k files) evaluated instead
    /// of a held-out share; empty: use the split.
    std::string path;
    /// Evaluate every this many optimizer steps; nullopt: at the end of every epoch. Always also
    /// when the run reaches its limit.
    std::optional<int64_t> everySteps;
};

/// Builds the model on the trainer thread (so its parameters count against the device).
using ModelFactory = std::function<tl::expected<std::shared_ptr<Model>, std::string>(const Dataset& data)>;
using DatasetFactory = std::function<tl::expected<std::shared_ptr<Dataset>, std::string>()>;

/// When and where checkpoints are written (see checkpoint.h).
/// An interval or keepBest without a directory asks for checkpoints in the run's folder: the
/// front end that records the run fills in `directory` (core/records/run_folder.h); a trainer given
/// neither refuses to start.
struct CheckpointOptions {
    std::string directory;   ///< empty: no checkpoints
    int64_t everySteps = 0;  ///< also every N optimizer steps; 0: only when the run ends or stops
    /// Also keep the model that scored best on this validation metric so far in
    /// `directory`/best (a checkpoint like the latest one: resume from it, or load its model);
    /// one of validationMetricNames() (core/events/events.h), e.g. "val_accuracy"; empty: only the latest.
    std::string keepBest;
};

/// Where the next micro-batch is loaded while the current one computes.
enum class Prefetch {
    /// On the prefetch thread where a CPU is free for it: always for a CUDA device (the GPU
    /// computes, the CPUs wait); on the CPU and virtual devices only when the intra-op threads and
    /// TrainerOptions::reservedCpus leave a CPU over. Where they take every CPU (the CLI's
    /// default), a thread loading beside them takes a core from one of LibTorch's OpenMP workers
    /// and the others wait for it at the end of each parallel region: on 2 CPUs with 2 threads
    /// the MLP trained at 0.95-0.98 of a plain loop that loads in line, and at 0.98-0.99 loading
    /// in line itself (docs/PERFORMANCE.md, memory parity).
    Auto,
    Thread,  ///< always on the prefetch thread
    Inline,  ///< on the trainer thread when each micro-batch starts, as a plain loop does
};

struct TrainerOptions {
    ModelOptions model;
    DataOptions data;
    std::string device = "cpu";
    int64_t targetBatch = 64;
    ProbeOptions probe;
    OptimizerOptions optimizer;
    LossKind loss = LossKind::CrossEntropy;
    MemorySavers memorySavers = MemorySavers::Off;
    /// When a probe (of the run's start, a device switch or a target change) finds a micro-batch
    /// below this many samples, and below the target batch, the trainer measures every memory
    /// saver on the model (SaverSurvey) and suggests the one with the best predicted throughput;
    /// memory_savers auto applies it. 0: only when asked (Trainer::surveySavers) or nothing fits.
    int64_t saverThreshold = 4;
    /// float16 autocast (memory savers fp16, checkpoint-fp16): the loss is multiplied by this
    /// before backward, so that small gradients do not round to zero in float16; halved (and the
    /// batch trained again) when a gradient overflows, doubled after kLossScaleGrowthSteps steps
    /// without overflow. PyTorch's GradScaler starts at the same 65536.
    double lossScale = 65536;
    /// Optimizer steps to run; nullopt: no step limit. With neither steps nor epochs the run goes
    /// on until it is stopped (the GUI's "unlimited"). See setEpochs() for how the two combine.
    std::optional<int64_t> steps = kDefaultSteps;
    std::optional<int64_t> epochs;  ///< whole passes over the data; nullopt: no epoch limit
    uint64_t seed = 0;              ///< model initialisation and sampler order
    /// How the learning rate follows a target-batch change (Trainer::setTargetBatch without a rule).
    LrScaling lrScaling = LrScaling::None;
    int regrowAfterSteps = 20;           ///< clean steps after an OOM shrink before trying to grow
    double memorySampleInterval = 0.05;  ///< seconds between memory samples (at most)
    bool reportSampleIndices = false;    ///< fill MicroBatchDone::sampleIndices (tests, step mode)
    bool reportGradientNorm = false;     ///< fill MicroBatchDone::gradientNorm (one norm per micro-batch)
    bool stepMode = false;               ///< start in step-by-step mode (see Trainer::setStepMode)
    /// Where the next micro-batch is loaded (Prefetch).
    Prefetch prefetch = Prefetch::Auto;
    int intraOpThreads = 0;  ///< LibTorch CPU threads; 0: OMP_NUM_THREADS, else every CPU (intraOpThreadsFor)
    int reservedCpus = 0;    ///< with intraOpThreads 0: CPUs left to other busy threads (the app's GUI thread)
    /// cuda:N only: cap this process's share of the GPU's memory (0 < f <= 1) through the
    /// caching allocator, so that a large GPU runs out of memory like a small one; 0: no cap.
    double cudaMemoryFraction = 0.0;
    ValidationOptions validation;
    CheckpointOptions checkpoint;
    std::string resumeFrom;  ///< checkpoint directory to continue from; empty: fresh start
    /// The run's folder (core/records/run_folder.h), filled by the front end that records the run:
    /// a memory snapshot is written there at each OOM (OomEvent::snapshotFile). Empty: none.
    std::string runFolder;
    /// Several devices (core/distributed/process_group.h): this process is one rank of a data-parallel job
    /// and trains its share of every training batch; null: one process trains the whole batch.
    std::shared_ptr<ProcessGroupLink> parallel;
    /// Several devices: optimizer steps between checks that every rank holds the same parameters
    /// (also checked at the end of the run); 0: only at the end.
    int64_t parameterCheckEvery = 50;
    /// Several devices: shares follow each device's memory, probed micro-batch and measured speed
    /// (core/plan/rank_shares.h); false: every rank trains an equal share of every batch (what
    /// DDP-style tools do), for comparison.
    bool balanceShares = true;

    /// Optional overrides of the built-in model and dataset (tests, user models).
    ModelFactory modelFactory;
    DatasetFactory datasetFactory;
    /// For tests: the clock that times micro-batches and training batches, by which the
    /// fastest-size search and its drift check decide; empty: std::chrono::steady_clock. A test
    /// that advances its own clock makes those decisions independent of the machine's speed.
    std::function<std::chrono::steady_clock::time_point()> timingClock;
};

/// Limits every front end shares (the CLI, the configuration file, the GUI).
inline constexpr int64_t kMaxTargetBatch = int64_t{1} << 31;
inline constexpr int64_t kMaxSteps = int64_t{1} << 40;
inline constexpr int64_t kMaxEpochs = 1'000'000;
inline constexpr int kMaxThreads = 256;
/// Devices of one job (--devices): one process each.
inline constexpr int kMaxDevices = 256;
inline constexpr int64_t kMaxSamples = 100'000'000;  ///< synthetic data set
inline constexpr int64_t kMaxClasses = 1'000'000;
inline constexpr int64_t kMaxSampleElements = int64_t{3} << 24;  ///< values per sample (3x4096x4096)
inline constexpr int64_t kMaxChannels = 4096;
inline constexpr int64_t kMaxImageSide = 16384;  ///< pixels, height or width
inline constexpr int64_t kMinModelWidth = 8;
inline constexpr int64_t kMaxModelWidth = 4096;
inline constexpr int kMaxProbeTrials = 1000;
inline constexpr int kMaxRegrowAfterSteps = 1'000'000;
inline constexpr int64_t kMaxRetimeEvery = 1'000'000;
inline constexpr double kMaxLearningRate = 1e6;
inline constexpr double kMaxLossScale = 1e30;  ///< float16 loss scale (a float32 loss times it stays finite)
inline constexpr double kMaxWeightDecay = 1e6;

/// Limits the run to `epochs` passes over the data. Without an explicit step count the default
/// step limit no longer applies (`--epochs 3` alone runs three epochs); with one, whichever limit
/// comes first ends the run.
void setEpochs(TrainerOptions& options, int64_t epochs, bool stepsGiven);

/// What is wrong with a set of options: the field as a configuration-file key path
/// ("target_batch", "probe.max_micro_batch", "data.path", "model.name", "device") and a message
/// that names the value and what would be valid.
struct OptionProblem {
    std::string field;
    std::string message;
};

/// Checks ranges and names; the message names the field, the value and the valid range.
tl::expected<void, OptionProblem> check(const TrainerOptions& options);
/// check() with the message only.
tl::expected<void, std::string> validate(const TrainerOptions& options);

/// Fills in what some options imply for others: a CSV trained with MSE is a regression table
/// (data.regression). Part of resolve(); the configuration reader applies it on its own.
void settle(TrainerOptions& options);

/// The rules every front end (the CLI, the configuration file, the GUI) shares, in one place:
/// settles what the options mean (a CSV trained with MSE is a regression table), checks that
/// the model is built in or an existing TorchScript file, that the data set is known and has the
/// path it needs, that the device parses, and then check()s the ranges.
tl::expected<TrainerOptions, OptionProblem> resolve(TrainerOptions options);

}  // namespace batchpilot::core
