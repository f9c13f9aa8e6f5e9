// Compiled with exactly what ui/ gets from its libraries (tests/layering/CMakeLists.txt): it
// must fail, because ui/ sees the engine only through torch-free headers.
#include <torch/torch.h>

int uiIncludesTorch() {
    return static_cast<int>(torch::ones({1}).numel());
}
