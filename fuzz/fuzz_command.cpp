// parseRemoteCommand: the body of a POST /command to batchpilot-cli --serve, from whoever reaches
// the port with the control token. Any bytes: a command or a message, never a crash; a command
// read is one of the kinds, with values in the ranges the command line allows.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "app/run_server.h"

using namespace batchpilot;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string body(reinterpret_cast<const char*>(data), size);
    const auto command = app::parseRemoteCommand(body);
    if (!command) {
        if (command.error().empty()) std::abort();  // a refusal always says why
        return 0;
    }
    using Kind = app::RemoteCommand::Kind;
    switch (command->kind) {
    case Kind::TargetBatch:
        if (command->targetBatch < 1) std::abort();
        break;
    case Kind::Device:
        if (command->device.empty() || command->rank < 0) std::abort();
        break;
    case Kind::CheckEquivalence:
        if (command->samples < 0) std::abort();
        break;
    default: break;
    }
    if (app::describe(*command).empty()) std::abort();
    return 0;
}
