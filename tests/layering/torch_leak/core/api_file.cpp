#include <torch/script.h>
