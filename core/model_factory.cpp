#include "core/model_factory.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "core/dataset.h"
#include "core/torchscript_model.h"

namespace batchpilot::core {

bool isModelFile(const std::string& name) {
    const auto builtins = builtinModelNames();
    if (std::find(builtins.begin(), builtins.end(), name) != builtins.end()) return false;
    if (name.ends_with(".pt") || name.ends_with(".pth")) return true;
    std::error_code ec;
    return !name.empty() && std::filesystem::is_regular_file(name, ec);
}

tl::expected<std::shared_ptr<Model>, std::string> makeModel(const ModelOptions& options, const Dataset& data) {
    if (isModelFile(options.name)) return loadTorchScriptModel(options.name, data);
    const auto builtins = builtinModelNames();
    if (std::find(builtins.begin(), builtins.end(), options.name) == builtins.end()) {
        std::ostringstream names;
        for (const auto& n : builtins) names << (names.tellp() > 0 ? ", " : "") << n;
        return tl::unexpected("unknown model \"" + options.name + "\": choose one of " + names.str() +
                              ", or give a TorchScript file (.pt or .pth)");
    }
    return makeBuiltinModel(options, data.sampleShape(), data.classes());
}

}  // namespace batchpilot::core
