#pragma once

#include <memory>
#include <string>

#include <tl/expected.hpp>

#include "core/nn/model.h"
#include "core/config/options.h"

namespace batchpilot::core {

class Dataset;

/// The model `options` names, shaped for `data`: a built-in model ("mlp", "cnn", "resnet") for
/// the data's sample shape and classes, or the TorchScript file loaded and checked against one
/// sample (see loadTorchScriptModel). The current torch seed decides built-in initial weights.
/// Unknown names are an error listing the valid ones.
///
/// Thread rules: call on the trainer thread (the model's memory counts against its device).
tl::expected<std::shared_ptr<Model>, std::string> makeModel(const ModelOptions& options, const Dataset& data);

}  // namespace batchpilot::core
