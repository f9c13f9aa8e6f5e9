#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include <tl/expected.hpp>

namespace batchpilot::core {

class Model;
class Optimizer;

/// What the trainer needs, besides model and optimizer, to continue exactly where it stopped.
struct TrainerState {
    int64_t step = 0;
    int64_t samplesSeen = 0;
    int64_t samplerEpoch = 0;
    int64_t samplerPosition = 0;
    int64_t targetBatch = 0;
    int64_t microBatch = 0;  ///< micro-batch known to fit on `device`
    double learningRate = 0;
    std::string device;
    std::string modelName;
    /// Samples of the training set the sampler walks (the data set less any held-out share);
    /// -1: not recorded (a checkpoint written before validation data was held out).
    int64_t trainingSamples = -1;
    /// The validation metric the run keeps its best model by (CheckpointOptions::keepBest) and
    /// the best value it reached so far (NaN: none yet), so that a resumed run goes on comparing.
    std::string bestMetric;
    double bestValue = std::numeric_limits<double>::quiet_NaN();
    /// float16 autocast's loss scale when the checkpoint was written (0: not recorded, or the run
    /// did not scale), so that a resumed run scales as the uninterrupted one would.
    double lossScale = 0;
    /// What the run trained on and how, for a resumed run to refuse another (empty or nullopt:
    /// not recorded, a checkpoint written before they were): the training set's
    /// Dataset::fingerprint(), the loss ("cross-entropy", "mse") and the run's seed (the sampler's
    /// order of the samples).
    std::string dataFingerprint;
    std::string loss;
    std::optional<uint64_t> seed;
};

/// Folder inside a checkpoint directory that holds the best model so far (CheckpointOptions::keepBest).
inline constexpr const char* kBestCheckpointFolder = "best";

/// File name of the latest checkpoint inside a checkpoint directory.
inline constexpr const char* kCheckpointFile = "checkpoint.pt";

/// Writes model parameters and buffers, optimizer state and trainer state to
/// `directory`/checkpoint.pt. Written to a temporary file, synced, then renamed over the old one,
/// so a crash during a save never leaves a corrupt latest checkpoint. The file starts with a
/// header holding the archive's length and CRC-32, checked before anything is loaded.
/// Thread rules: call on the trainer thread.
tl::expected<std::string, std::string> saveCheckpoint(const std::string& directory, const Model& model,
                                                      const Optimizer& optimizer, const TrainerState& state);

/// Creates `directory` if needed and checks that a file can be written in it (by creating and
/// removing a temporary one), so that a run learns before training that it could not save.
tl::expected<void, std::string> checkCheckpointDirectory(const std::string& directory);

/// A checkpoint folder held by one run: an exclusive lock (flock) on `directory`/.batchpilot.lock,
/// which records the holder's process id. Two runs saving into one folder (two resumes of the same
/// checkpoint, say) would overwrite each other's checkpoints; the second is refused instead,
/// naming the first. Released when the object is destroyed or the process ends, also by kill -9.
class CheckpointFolderLock {
public:
    /// Takes the folder's lock (the folder must exist); the error names the process holding it.
    /// Where the file system cannot lock (some FUSE and SMB mounts), the run goes on unlocked and
    /// unlockedWhy() says so, for a warning.
    static tl::expected<CheckpointFolderLock, std::string> acquire(const std::string& directory);
    const std::string& unlockedWhy() const { return m_unlockedWhy; }
    CheckpointFolderLock(CheckpointFolderLock&& other) noexcept
        : m_fd(other.m_fd), m_unlockedWhy(std::move(other.m_unlockedWhy)) {
        other.m_fd = -1;
    }
    CheckpointFolderLock& operator=(CheckpointFolderLock&& other) noexcept;
    CheckpointFolderLock(const CheckpointFolderLock&) = delete;
    CheckpointFolderLock& operator=(const CheckpointFolderLock&) = delete;
    ~CheckpointFolderLock();

private:
    explicit CheckpointFolderLock(int fd, std::string unlockedWhy = {})
        : m_fd(fd), m_unlockedWhy(std::move(unlockedWhy)) {}
    int m_fd = -1;
    std::string m_unlockedWhy;
};

/// Name of the lock file inside a checkpoint directory (CheckpointFolderLock).
inline constexpr const char* kCheckpointLockFile = ".batchpilot.lock";

/// Loads `directory`/checkpoint.pt into `model` and `optimizer` (already built the same way) and
/// returns the trainer state. A missing, corrupt or mismatched checkpoint (other model, other
/// parameter shapes, other optimizer) is an error saying which, and so is one with any field
/// outside what a run writes (core/train/checkpoint_reader.h): every field is checked before
/// `model` or `optimizer` is changed, and memory is bounded by the file's size.
tl::expected<TrainerState, std::string> loadCheckpoint(const std::string& directory, Model& model,
                                                       Optimizer& optimizer);

}  // namespace batchpilot::core
