#include "core/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fcntl.h>
#include <unistd.h>

#include <torch/torch.h>

#include "core/counting_allocator.h"
#include "core/model.h"
#include "core/optimizer.h"

namespace batchpilot::core {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFormat = 1;

std::string indexed(const char* prefix, size_t i) { return std::string(prefix) + std::to_string(i); }

/// Makes the renamed file's contents durable before it replaces the previous checkpoint.
void syncFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

void writeTensors(torch::serialize::OutputArchive& archive, const char* prefix, const std::vector<torch::Tensor>& tensors) {
    archive.write(std::string(prefix) + "count", c10::IValue(static_cast<int64_t>(tensors.size())));
    for (size_t i = 0; i < tensors.size(); ++i) archive.write(indexed(prefix, i), tensors[i].detach().cpu());
}

std::vector<torch::Tensor> readTensors(torch::serialize::InputArchive& archive, const char* prefix) {
    c10::IValue count;
    archive.read(std::string(prefix) + "count", count);
    std::vector<torch::Tensor> out(static_cast<size_t>(count.toInt()));
    for (size_t i = 0; i < out.size(); ++i) archive.read(indexed(prefix, i), out[i]);
    return out;
}

int64_t readInt(torch::serialize::InputArchive& archive, const std::string& key) {
    c10::IValue value;
    archive.read(key, value);
    return value.toInt();
}

}  // namespace

tl::expected<std::string, std::string> saveCheckpoint(const std::string& directory, const Model& model,
                                                      const Optimizer& optimizer, const TrainerState& state) {
    // Host-side copies for the file: they do not use the device's memory.
    CountingScope host(false);
    std::error_code error;
    fs::create_directories(directory, error);
    if (error) return tl::unexpected("cannot create the checkpoint directory \"" + directory + "\": " + error.message());
    const std::string path = (fs::path(directory) / kCheckpointFile).string();
    const std::string temporary = path + ".tmp";
    try {
        torch::serialize::OutputArchive archive;
        archive.write("format", c10::IValue(kFormat));
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
        writeTensors(archive, "parameter", model.parameters());
        writeTensors(archive, "buffer", model.buffers());
        writeTensors(archive, "first", optimizer.firstState());
        writeTensors(archive, "second", optimizer.secondState());
        archive.save_to(temporary);
    } catch (const std::exception& e) {
        std::remove(temporary.c_str());
        return tl::unexpected("could not write the checkpoint \"" + path + "\": " + e.what());
    }
    syncFile(temporary);
    fs::rename(temporary, path, error);
    if (error) return tl::unexpected("could not replace the checkpoint \"" + path + "\": " + error.message());
    return path;
}

tl::expected<TrainerState, std::string> loadCheckpoint(const std::string& directory, Model& model, Optimizer& optimizer) {
    const std::string path = (fs::path(directory) / kCheckpointFile).string();
    if (!fs::exists(path)) {
        return tl::unexpected("no checkpoint to resume from: \"" + path + "\" does not exist");
    }
    TrainerState state;
    std::vector<torch::Tensor> parameters, buffers, first, second;
    int64_t optimizerKind = 0;
    int64_t optimizerSteps = 0;
    try {
        CountingScope host(false);
        torch::serialize::InputArchive archive;
        archive.load_from(path);
        if (readInt(archive, "format") != kFormat) {
            return tl::unexpected("checkpoint \"" + path + "\" has an unknown format version");
        }
        c10::IValue text;
        archive.read("model_name", text);
        state.modelName = text.toStringRef();
        archive.read("device", text);
        state.device = text.toStringRef();
        c10::IValue rate;
        archive.read("learning_rate", rate);
        state.learningRate = rate.toDouble();
        optimizerKind = readInt(archive, "optimizer_kind");
        optimizerSteps = readInt(archive, "optimizer_steps");
        state.step = readInt(archive, "step");
        state.samplesSeen = readInt(archive, "samples_seen");
        state.samplerEpoch = readInt(archive, "sampler_epoch");
        state.samplerPosition = readInt(archive, "sampler_position");
        state.targetBatch = readInt(archive, "target_batch");
        state.microBatch = readInt(archive, "micro_batch");
        parameters = readTensors(archive, "parameter");
        buffers = readTensors(archive, "buffer");
        first = readTensors(archive, "first");
        second = readTensors(archive, "second");
    } catch (const std::exception& e) {
        std::string why = e.what();
        why = why.substr(0, why.find('\n'));
        return tl::unexpected("checkpoint \"" + path + "\" is corrupt or not a BatchPilot checkpoint (" + why +
                              "); resume from an intact one or start afresh");
    }
    if (state.modelName != model.name()) {
        return tl::unexpected("checkpoint \"" + path + "\" was written for model \"" + state.modelName +
                              "\", but this run builds \"" + model.name() + "\": use the same model to resume");
    }
    if (optimizerKind != static_cast<int64_t>(optimizer.kind())) {
        return tl::unexpected("checkpoint \"" + path + "\" was written with the " +
                              toString(static_cast<OptimizerKind>(optimizerKind)) + " optimizer, but this run uses " +
                              toString(optimizer.kind()) + ": use the same optimizer to resume");
    }
    auto target = model.parameters();
    auto targetBuffers = model.buffers();
    bool shapesMatch = parameters.size() == target.size() && buffers.size() == targetBuffers.size();
    for (size_t i = 0; shapesMatch && i < target.size(); ++i) shapesMatch = parameters[i].sizes() == target[i].sizes();
    for (size_t i = 0; shapesMatch && i < targetBuffers.size(); ++i) shapesMatch = buffers[i].sizes() == targetBuffers[i].sizes();
    for (size_t i = 0; shapesMatch && i < first.size(); ++i) shapesMatch = i < target.size() && first[i].sizes() == target[i].sizes();
    if (!shapesMatch) {
        return tl::unexpected("checkpoint \"" + path + "\" does not match this model's parameters (other width, input "
                              "size or number of classes): use the same model options to resume");
    }
    torch::NoGradGuard noGrad;
    const auto device = target.front().device();
    for (size_t i = 0; i < target.size(); ++i) target[i].copy_(parameters[i]);
    for (size_t i = 0; i < targetBuffers.size(); ++i) targetBuffers[i].copy_(buffers[i]);
    // Copies made on the trainer thread: the state counts against the device again.
    for (auto& t : first) t = t.to(device, /*non_blocking=*/false, /*copy=*/true);
    for (auto& t : second) t = t.to(device, /*non_blocking=*/false, /*copy=*/true);
    optimizer.restore(std::move(first), std::move(second), optimizerSteps);
    optimizer.setLearningRate(state.learningRate);
    return state;
}

}  // namespace batchpilot::core
