# Shared by scripts/test, scripts/demo and scripts/bench: install what is missing, configure, build.
# Debian 12; run as root (or with sudo available) on a fresh machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"

PACKAGES=(
  cmake g++ ninja-build ccache pkg-config
  libtorch-dev
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev libgl-dev
  nlohmann-json3-dev libexpected-dev libstb-dev zlib1g-dev
  fonts-dejavu-core
)

install_missing() {
  local missing=()
  for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "Installing: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "error: installing packages needs root; run as root or install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

configure_and_build() {
  # The precompiled torch header makes ccache need these to reuse results.
  export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
  # Relative paths in the cache keys: a fresh clone in another folder still hits the cache.
  export CCACHE_BASEDIR="$ROOT"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
  cmake --build "$BUILD_DIR" -j "$(nproc)"
}
