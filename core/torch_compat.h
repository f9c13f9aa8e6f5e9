#pragma once

// Where Debian's LibTorch 1.13 and the current LibTorch from PyPI (2.x) differ, and nowhere else.
// Every difference is one macro or one small function here, named for what it bridges.

#include <torch/version.h>

/// True for LibTorch from `major.minor` on.
#define BATCHPILOT_TORCH_AT_LEAST(major, minor) \
    (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator::allocate lost its const in 2.3, which also added the pure virtual copy_data.
#if BATCHPILOT_TORCH_AT_LEAST(2, 3)
#define BATCHPILOT_ALLOCATE_CONST
#define BATCHPILOT_ALLOCATOR_HAS_COPY_DATA 1
#else
#define BATCHPILOT_ALLOCATE_CONST const
#define BATCHPILOT_ALLOCATOR_HAS_COPY_DATA 0
#endif
