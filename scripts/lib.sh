# Shared by scripts/test, scripts/demo and scripts/bench: install what is missing, configure, build.
# Debian 12; run as root (or with sudo available) on a fresh machine.
#
# Two LibTorch builds from one code base (see docs/guide/gpu.md):
#   debian  Debian's libtorch-dev (1.13, CPU): the default where no NVIDIA GPU is present.
#   pip     the LibTorch inside PyPI's torch (2.x, built with CUDA), installed with pip into
#           .venv-torch/ in the checkout: the default where `nvidia-smi` reports a GPU.
# `--torch debian|pip` (or BATCHPILOT_TORCH) chooses; each build has its own folder
# (build/ and build-pip/, or BUILD_DIR).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-torch"
# The PyPI torch the pip build is tested with; torchvision is the release made for it.
PIP_TORCH="${BATCHPILOT_PIP_TORCH:-torch==2.15.0}"

# libgloo-dev: Gloo's headers, for training on several devices (c10d's ProcessGroupGloo; both
# LibTorch builds carry its code, PyPI's ships no headers for it).
PACKAGES=(
  cmake g++ ninja-build ccache pkg-config mold
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev libgl-dev
  nlohmann-json3-dev libexpected-dev libcli11-dev libstb-dev zlib1g-dev libpng-dev libturbojpeg0-dev
  libcpp-httplib-dev
  libgloo-dev
  fonts-dejavu-core
)
# Debian's LibTorch, its Python twin (the tests export torchvision models with it) and an
# optimised BLAS: without one, LibTorch's linear layers run on the reference BLAS. BLIS, chosen
# over OpenBLAS on measurement (docs/PERFORMANCE.md, roofline): 16.6x the reference BLAS on the
# MLP against OpenBLAS's 13.8x at one thread, and its single-threaded default does not fight
# LibTorch's own threads, where OpenBLAS's pthreads halved the MLP's speed at two.
DEBIAN_TORCH_PACKAGES=(libtorch-dev python3-torch python3-torchvision libblis4-pthread)
PIP_TORCH_PACKAGES=(python3-venv python3-pip)
# The sanitizer and fuzzer builds (configure_sanitizer_build): Clang and its run-time libraries.
SANITIZER_PACKAGES=(clang libclang-rt-dev)

# Reads --torch debian|pip from the arguments; the others are left in REST_ARGS.
TORCH_BUILD="${BATCHPILOT_TORCH:-auto}"
REST_ARGS=()
parse_torch_flag() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --torch) [ $# -ge 2 ] || { echo "error: --torch needs a value: debian or pip" >&2; exit 2; }
               TORCH_BUILD="$2"; shift 2 ;;
      --torch=*) TORCH_BUILD="${1#--torch=}"; shift ;;
      *) REST_ARGS+=("$1"); shift ;;
    esac
  done
  if [ "$TORCH_BUILD" = auto ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
      TORCH_BUILD=pip
      echo "An NVIDIA GPU is present: building against the CUDA LibTorch from PyPI (--torch debian for Debian's)."
    else
      TORCH_BUILD=debian
    fi
  fi
  case "$TORCH_BUILD" in
    debian) BUILD_DIR="${BUILD_DIR:-$ROOT/build}" ;;
    pip) BUILD_DIR="${BUILD_DIR:-$ROOT/build-pip}" ;;
    *) echo "error: --torch must be debian or pip, not \"$TORCH_BUILD\"" >&2; exit 2 ;;
  esac
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  else
    command -v sudo >/dev/null || { echo "error: installing packages needs root; run as root or install: ${*: -1}" >&2; exit 1; }
    sudo "$@"
  fi
}

install_missing() {
  local wanted=("${PACKAGES[@]}")
  if [ "${TORCH_BUILD:-debian}" = pip ]; then
    wanted+=("${PIP_TORCH_PACKAGES[@]}")
  else
    wanted+=("${DEBIAN_TORCH_PACKAGES[@]}")
  fi
  local missing=()
  for package in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "Installing: ${missing[*]}"
    as_root apt-get update -q
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  if [ "${TORCH_BUILD:-debian}" = pip ]; then
    install_pip_torch
  fi
}

# The Python interpreter of the pip build's virtual environment, with torch and torchvision.
install_pip_torch() {
  # Debian's python3 (python3-venv is installed for it), whatever else is first on PATH.
  local python=/usr/bin/python3
  [ -x "$python" ] || python="$(command -v python3)"
  if [ ! -x "$VENV/bin/python" ]; then
    echo "Creating $VENV with $python"
    "$python" -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -c 'import torch, torchvision' 2>/dev/null ||
     [ "$("$VENV/bin/python" -c 'import torch; print("torch==" + torch.__version__.split("+")[0])')" != "$PIP_TORCH" ]; then
    echo "Installing $PIP_TORCH and torchvision from PyPI into $VENV (about 5 GB with CUDA's libraries)"
    "$VENV/bin/python" -m pip install -q --upgrade "$PIP_TORCH" torchvision
  fi
}

# ccache settings every build shares.
use_ccache() {
  # The precompiled torch header makes ccache need these to reuse results.
  export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
  # Relative paths in the cache keys: a fresh clone in another folder still hits the cache.
  export CCACHE_BASEDIR="$ROOT"
}

# Sets PIP_TORCH_ARGS: the CMake arguments that build against the virtual environment's LibTorch.
pip_torch_args() {
  local prefix torch_root
  prefix="$("$VENV/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
  torch_root="$(dirname "$(dirname "$prefix")")"
  # The torch folder itself comes first, so that its lib/ is searched before the system's: where
  # Debian's libtorch-dev is installed too, LibTorch's CMake files would otherwise link
  # /usr/lib's libtorch.so with the wheel's headers.
  PIP_TORCH_ARGS=(-DCMAKE_PREFIX_PATH="$torch_root;$prefix" -DBATCHPILOT_TEST_PYTHON="$VENV/bin/python")
  # LibTorch's CMake files look for the CUDA toolkit; the wheel's own copies are not a toolkit.
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
}

configure_and_build() {
  use_ccache
  local torch_args=()
  if [ "${TORCH_BUILD:-debian}" = pip ]; then
    pip_torch_args
    torch_args=("${PIP_TORCH_ARGS[@]}")
  else
    torch_args=(-DBATCHPILOT_TEST_PYTHON=/usr/bin/python3)
  fi
  # -g1: line tables and function names (backtraces, profilers), no variable locations. With
  # torch's headers full -g made a test file compile 25% slower (56 s against 45 s).
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" "${torch_args[@]}" "$@"
  build_tree
}

# cmake --build with every core; BATCHPILOT_QUIET_BUILD=1 (.ci/run) leaves out ninja's progress
# lines, so that a CI log's tail shows test results and stage times (compiler output still shows).
#   build_tree [cmake --build arguments]
build_tree() {
  local quiet=()
  [ -z "${BATCHPILOT_QUIET_BUILD:-}" ] || quiet=(-- --quiet)
  cmake --build "$BUILD_DIR" -j "$(nproc)" "$@" "${quiet[@]}"
}

# The sanitizer build shared by scripts/check and scripts/fuzz: Clang (libFuzzer is Clang's) with
# PyPI's LibTorch (Clang cannot compile LibTorch 1.13's headers as C++20: its List.h uses
# std::vector<IValue> while IValue is incomplete). -O1 and line tables only: the code under test
# is ours, LibTorch itself is not instrumented, and this halves the build time of RelWithDebInfo.
# The window's code is built too (its tests run offscreen under both sanitizers).
#   configure_sanitizer_build address,undefined|thread [cmake --build arguments]
configure_sanitizer_build() {
  local sanitize="$1"; shift
  TORCH_BUILD=pip
  case "$sanitize" in
    thread) BUILD_DIR="${BUILD_DIR:-$ROOT/build-tsan}"; local fuzz=OFF ;;
    *) BUILD_DIR="${BUILD_DIR:-$ROOT/build-asan}"; local fuzz=ON ;;
  esac
  PACKAGES+=("${SANITIZER_PACKAGES[@]}")
  install_missing
  use_ccache
  pip_torch_args
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -gline-tables-only" \
    -DCMAKE_CXX_COMPILER=clang++ "${PIP_TORCH_ARGS[@]}" \
    -DBUILD_TESTING=ON -DBATCHPILOT_GUI=ON -DBATCHPILOT_BENCH=OFF \
    -DBATCHPILOT_SANITIZE="$sanitize" -DBATCHPILOT_FUZZ="$fuzz"
  build_tree "$@"
}

# Sanitizer run-time settings; reports from inside LibTorch or Qt are suppressed in
# tests/sanitizers/, each suppression with its reason.
export_sanitizer_options() {
  local suppressions="$ROOT/tests/sanitizers"
  export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1"
  export LSAN_OPTIONS="suppressions=$suppressions/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$suppressions/ubsan.supp"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$suppressions/tsan.supp"
  # QtTest's per-function watchdog (5 minutes) is sized for plain builds: under ASan on a busy
  # 2-core machine tst_user_models' fault injection ran past it. Hangs are still caught by
  # ctest's --timeout.
  export QTEST_FUNCTION_TIMEOUT="${QTEST_FUNCTION_TIMEOUT:-1500000}"
}
