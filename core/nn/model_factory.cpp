#include "core/nn/model_factory.h"

#include <algorithm>

#include "core/data/dataset.h"
#include "core/nn/torchscript_model.h"

namespace batchpilot::core {

tl::expected<std::shared_ptr<Model>, std::string> makeModel(const ModelOptions& options, const Dataset& data) {
    if (isModelFile(options.name)) return loadTorchScriptModel(options.name, data);
    const auto builtins = builtinModelNames();
    if (std::find(builtins.begin(), builtins.end(), options.name) == builtins.end()) {
        return tl::unexpected("unknown model \"" + options.name + "\": choose " + choiceList(builtins) +
                              ", or give a TorchScript file (.pt or .pth)");
    }
    return makeBuiltinModel(options, data.sampleShape(), data.classes());
}

}  // namespace batchpilot::core
