#include "core/train/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <torch/torch.h>

#include "core/data/dataset.h"
#include "core/device/counting_allocator.h"
#include "core/base/durable_file.h"
#include "core/base/hold_point.h"
#include "core/nn/model.h"
#include "core/optim/optimizer.h"
#include "core/train/checkpoint_reader.h"

namespace batchpilot::core {
namespace {

namespace fs = std::filesystem;

std::string indexed(const char* prefix, size_t i) {
    return std::string(prefix) + std::to_string(i);
}

/// The file: this header, then LibTorch's archive (a zip). The CRC-32 covers the archive, whose
/// own zip reader does not check its records, so any damaged byte is found before it is used.
constexpr char kMagic[16] = {'B', 'A', 'T', 'C', 'H', 'P', 'I', 'L', 'O', 'T', '-', 'C', 'K', 'P', 'T', '\n'};
constexpr size_t kCheckpointHeaderBytes = sizeof(kMagic) + 8 + 4;

void putLittleEndian(char* out, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
uint64_t getLittleEndian(const char* in, int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) value |= uint64_t(static_cast<unsigned char>(in[i])) << (8 * i);
    return value;
}

/// Writes the header and the archive to a new file and syncs it; false with the reason in `error`.
bool writeDurably(const std::string& path, const std::string& header, const std::string& bytes, std::string& error) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        error = std::strerror(errno);
        return false;
    }
    // Written in two halves, so that a test can kill the process between them (holdPoint).
    const std::string_view archive(bytes);
    auto written = writeAll(fd, {header, archive.substr(0, archive.size() / 2)});
    if (written) {
        holdPoint("checkpoint-write");
        written = writeAllAndSync(fd, {archive.substr(archive.size() / 2)});
    }
    if (!written) error = written.error();
    if (::close(fd) != 0 && written) {
        error = std::strerror(errno);
        return false;
    }
    return written.has_value();
}

/// Makes a rename inside `directory` durable.
void syncDirectory(const std::string& directory) {
    const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

void writeTensors(torch::serialize::OutputArchive& archive, const char* prefix,
                  const std::vector<torch::Tensor>& tensors) {
    archive.write(std::string(prefix) + "count", c10::IValue(static_cast<int64_t>(tensors.size())));
    for (size_t i = 0; i < tensors.size(); ++i) archive.write(indexed(prefix, i), tensors[i].detach().cpu());
}

/// The checkpoint's fields and tensors as a torch archive's bytes (throws what torch throws).
std::string archived(const Model& model, const Optimizer& optimizer, const TrainerState& state) {
    torch::serialize::OutputArchive archive;
    archive.write("format", c10::IValue(kCheckpointFormat));
    archive.write("model_name", c10::IValue(state.modelName));
    archive.write("optimizer_kind", c10::IValue(static_cast<int64_t>(optimizer.kind())));
    archive.write("optimizer_steps", c10::IValue(optimizer.stepCount()));
    archive.write("step", c10::IValue(state.step));
    archive.write("samples_seen", c10::IValue(state.samplesSeen));
    archive.write("sampler_epoch", c10::IValue(state.samplerEpoch));
    archive.write("sampler_position", c10::IValue(state.samplerPosition));
    archive.write("target_batch", c10::IValue(state.targetBatch));
    archive.write("micro_batch", c10::IValue(state.microBatch));
    archive.write("learning_rate", c10::IValue(state.learningRate));
    archive.write("device", c10::IValue(state.device));
    archive.write("training_samples", c10::IValue(state.trainingSamples));
    archive.write("best_metric", c10::IValue(state.bestMetric));
    archive.write("best_value", c10::IValue(state.bestValue));
    archive.write("loss_scale", c10::IValue(state.lossScale));
    archive.write("data_fingerprint", c10::IValue(state.dataFingerprint));
    archive.write("loss", c10::IValue(state.loss));
    if (state.seed) archive.write("seed", c10::IValue(static_cast<int64_t>(*state.seed)));
    writeTensors(archive, "parameter", model.parameters());
    writeTensors(archive, "buffer", model.buffers());
    writeTensors(archive, "first", optimizer.firstState());
    writeTensors(archive, "second", optimizer.secondState());
    std::ostringstream payload;
    archive.save_to(payload);
    return std::move(payload).str();
}

/// The archive's bytes in the checkpoint file at `path` (`fileBytes` long), checked against its
/// header's length and CRC-32; why not, where they cannot be read.
tl::expected<std::string, std::string> framedBytes(const std::string& path, uintmax_t fileBytes) {
    std::ifstream in(path, std::ios::binary);
    std::string header(kCheckpointHeaderBytes, '\0');
    in.read(header.data(), static_cast<std::streamsize>(header.size()));
    if (!in || std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0)
        return tl::unexpected<std::string>("no BatchPilot checkpoint header");
    const uint64_t length = getLittleEndian(header.data() + sizeof(kMagic), 8);
    const auto expectedCrc = static_cast<uint32_t>(getLittleEndian(header.data() + sizeof(kMagic) + 8, 4));
    // The length the header claims must be what the file holds: nothing is allocated for a
    // size the file does not have.
    if (length != fileBytes - kCheckpointHeaderBytes) {
        return tl::unexpected<std::string>(
            "the header says " + std::to_string(length) + " bytes follow, the file holds " +
            std::to_string(fileBytes - kCheckpointHeaderBytes) + "; it was cut short or altered");
    }
    std::string bytes(static_cast<size_t>(length), '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(length));
    if (!in) return tl::unexpected<std::string>("reading it failed");
    if (crc32Of(bytes.data(), bytes.size()) != expectedCrc)
        return tl::unexpected<std::string>("its CRC-32 checksum does not match: the file was damaged");
    return bytes;
}

}  // namespace

tl::expected<CheckpointFolderLock, std::string> CheckpointFolderLock::acquire(const std::string& directory) {
    const std::string path = (fs::path(directory) / kCheckpointLockFile).string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return tl::unexpected("cannot lock the checkpoint folder \"" + directory + "\" (" + path +
                              "): " + std::strerror(errno) + "; choose another folder");
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int why = errno;
        char holder[32] = {};
        const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
        ::close(fd);
        std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string();
        while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
        if (why == EWOULDBLOCK) {
            return tl::unexpected("the checkpoint folder \"" + directory + "\" is in use by another run" +
                                  (pid.empty() ? std::string() : " (process " + pid + ")") +
                                  ": two runs saving there would overwrite each other's checkpoints; wait for it "
                                  "to end, or give this run another checkpoint folder");
        }
        // A file system that cannot lock (ENOLCK, EOPNOTSUPP on some network and FUSE mounts) saved
        // checkpoints before there was a lock: it still does, unguarded, and says so.
        return CheckpointFolderLock(-1, "the checkpoint folder \"" + directory + "\" cannot be locked (" +
                                            std::strerror(why) +
                                            "): another run saving there at the same time would not be refused");
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd, 0) == 0) {
        [[maybe_unused]] const auto written = writeAll(fd, {pid});
    }
    return CheckpointFolderLock(fd);
}

CheckpointFolderLock& CheckpointFolderLock::operator=(CheckpointFolderLock&& other) noexcept {
    if (this != &other) {
        if (m_fd >= 0) ::close(m_fd);
        m_fd = other.m_fd;
        m_unlockedWhy = std::move(other.m_unlockedWhy);
        other.m_fd = -1;
    }
    return *this;
}

CheckpointFolderLock::~CheckpointFolderLock() {
    if (m_fd >= 0) ::close(m_fd);  // releases the lock; the file stays, with the last holder's id
}

tl::expected<void, std::string> checkCheckpointDirectory(const std::string& directory) {
    const std::string named = "the checkpoint folder \"" + directory + "\"";
    std::error_code error;
    fs::create_directories(directory, error);
    if (error) return tl::unexpected("cannot create " + named + ": " + error.message() + "; choose a writable folder");
    if (!fs::is_directory(directory, error))
        return tl::unexpected(named + " is not a folder; choose a folder for --checkpoint-dir");
    std::string probe = (fs::path(directory) / ".batchpilot-write-check.XXXXXX").string();
    const int fd = ::mkstemp(probe.data());
    if (fd < 0)
        return tl::unexpected("cannot write in " + named + ": " + std::strerror(errno) + "; choose a writable folder");
    // One block, synced: a full disk shows now rather than at the first save.
    const std::string block(4096, '\0');
    const auto written = writeAllAndSync(fd, {block});
    ::close(fd);
    ::unlink(probe.c_str());
    if (!written)
        return tl::unexpected("cannot write in " + named + ": " + written.error() +
                              "; free some space or choose another folder");
    return {};
}

tl::expected<std::string, std::string> saveCheckpoint(const std::string& directory, const Model& model,
                                                      const Optimizer& optimizer, const TrainerState& state) {
    // Host-side copies for the file: they do not use the device's memory.
    CountingScope host(false);
    std::error_code error;
    fs::create_directories(directory, error);
    if (error)
        return tl::unexpected("cannot create the checkpoint directory \"" + directory + "\": " + error.message());
    const std::string path = (fs::path(directory) / kCheckpointFile).string();
    const std::string temporary = path + ".tmp";
    std::string bytes;
    try {
        bytes = archived(model, optimizer, state);
    } catch (const std::exception& e) {
        return tl::unexpected("could not write the checkpoint \"" + path + "\": " + e.what());
    }
    std::string header(kCheckpointHeaderBytes, '\0');
    std::memcpy(header.data(), kMagic, sizeof(kMagic));
    putLittleEndian(header.data() + sizeof(kMagic), bytes.size(), 8);
    putLittleEndian(header.data() + sizeof(kMagic) + 8, crc32Of(bytes.data(), bytes.size()), 4);
    // A temporary left by a crash is never read; replace it.
    std::remove(temporary.c_str());
    std::string why;
    if (!writeDurably(temporary, header, bytes, why)) {
        std::remove(temporary.c_str());
        const bool full = why == std::strerror(ENOSPC) || why == std::strerror(EDQUOT);
        return tl::unexpected("could not write the checkpoint \"" + path + "\": " + why +
                              "; the previous checkpoint, if any, is unchanged" +
                              (full ? ": free some space there, or save checkpoints to another folder" : ""));
    }
    fs::rename(temporary, path, error);
    if (error) {
        std::remove(temporary.c_str());
        return tl::unexpected("could not replace the checkpoint \"" + path + "\": " + error.message());
    }
    syncDirectory(directory);
    return path;
}

tl::expected<TrainerState, std::string> loadCheckpoint(const std::string& directory, Model& model,
                                                       Optimizer& optimizer) {
    const std::string path = (fs::path(directory) / kCheckpointFile).string();
    if (!fs::exists(path)) {
        return tl::unexpected("no checkpoint to resume from: \"" + path + "\" does not exist");
    }
    const auto corrupt = [&](const std::string& why) {
        return tl::unexpected("checkpoint \"" + path + "\" is corrupt or not a BatchPilot checkpoint (" + why +
                              "); resume from an intact one or start afresh");
    };
    std::error_code sizeError;
    const auto fileBytes = fs::file_size(path, sizeError);
    if (sizeError || !fs::is_regular_file(path)) return corrupt("not a readable regular file");
    if (fileBytes < kCheckpointHeaderBytes) return corrupt("the file is only " + std::to_string(fileBytes) + " bytes");
    auto framed = framedBytes(path, fileBytes);
    if (!framed) return corrupt(framed.error());
    std::string bytes = std::move(*framed);
    tl::expected<CheckpointContents, std::string> contents;
    try {
        CountingScope host(false);
        torch::serialize::InputArchive archive;
        std::istringstream payload(std::move(bytes));
        archive.load_from(payload);
        // Every field checked before anything is applied: a refused checkpoint changes nothing.
        contents = readCheckpoint(archive, path, model, optimizer);
    } catch (const std::exception& e) {
        std::string why = e.what();
        return corrupt(why.substr(0, why.find('\n')));
    }
    if (!contents) return tl::unexpected(contents.error());
    torch::NoGradGuard noGrad;
    auto target = model.parameters();
    auto targetBuffers = model.buffers();
    const auto device = target.front().device();
    for (size_t i = 0; i < target.size(); ++i) target[i].copy_(contents->parameters[i]);
    for (size_t i = 0; i < targetBuffers.size(); ++i) targetBuffers[i].copy_(contents->buffers[i]);
    // Copies made on the trainer thread: the state counts against the device again.
    for (auto& t : contents->first) t = t.to(device, /*non_blocking=*/false, /*copy=*/true);
    for (auto& t : contents->second) t = t.to(device, /*non_blocking=*/false, /*copy=*/true);
    optimizer.restore(std::move(contents->first), std::move(contents->second), contents->optimizerSteps);
    optimizer.setLearningRate(contents->state.learningRate);
    return contents->state;
}

}  // namespace batchpilot::core
