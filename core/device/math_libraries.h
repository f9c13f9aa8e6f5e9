#pragma once

#include <string>

namespace batchpilot::core {

/// Which LibTorch and which math libraries this process computes with: what decides how fast a
/// linear layer runs on the CPU. Debian's LibTorch calls the system BLAS (libblas.so.3, chosen by
/// update-alternatives: the slow reference BLAS unless an optimised one is installed); the LibTorch
/// inside PyPI's torch has Intel MKL built in.
struct MathLibraries {
    std::string torchVersion;    ///< e.g. "1.13.1" or "2.15.0"
    bool torchCuda = false;      ///< LibTorch was built with CUDA
    std::string blas;            ///< e.g. "BLIS (pthreads)", "reference BLAS", "Intel MKL (in LibTorch)"
    std::string blasLibrary;     ///< the shared library's resolved path, when one is loaded
    bool referenceBlas = false;  ///< the unoptimised reference implementation: expect slow linear layers
    int intraOpThreads = 0;      ///< the intra-op threads a run uses (intraOpThreadsFor)
};

/// Intra-op threads a run uses: `requested` when positive; else OMP_NUM_THREADS when it is a
/// positive number (as PyTorch honours it: how a shared server or a test runner running several
/// jobs at once keeps each to its share); else every CPU this process may run on (its affinity
/// mask) less `reserved` for other busy threads, at least 1. LibTorch's own
/// default counts physical cores, which left half of a 2-vCPU machine idle. Measured there
/// (docs/PERFORMANCE.md, roofline and threads): headless, 2 threads train the convolutional models
/// 1.5x faster than 1; in the desktop app the GUI thread draws the charts with about half a core,
/// and 2 intra-op threads competing with it trained the MLP at half the speed of 1 and doubled the
/// window's latency, so the app reserves one CPU for it (TrainerOptions::reservedCpus).
int intraOpThreadsFor(int requested, int reserved = 0);

/// The CPUs this process may run on: its affinity mask, or its cgroup's CPU quota (cpu.max,
/// cgroup v2: a container's) where that is less; at least 1.
int cpusAvailable();

/// Reads it from LibTorch's build configuration and the libraries loaded into this process, for a
/// run asking for `requestedThreads` (0: the default). Call after LibTorch is loaded (any time in
/// a program linked with it). Thread-safe.
MathLibraries mathLibraries(int requestedThreads = 0, int reservedCpus = 0);

/// One line for people, e.g. "LibTorch 1.13.0 (CPU), BLAS: BLIS (pthreads), 2 intra-op threads".
std::string describe(const MathLibraries& libraries);

/// The warning to show when the reference BLAS is in use (empty otherwise): what it costs and
/// what to install.
std::string referenceBlasWarning(const MathLibraries& libraries);

}  // namespace batchpilot::core
