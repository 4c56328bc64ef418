#!/usr/bin/env bash
# Installs what is missing (Debian packages), then configures and builds ringtrain into build/.
# Sourced by scripts/run.sh, scripts/attention-check.sh and scripts/test.sh; safe to run again (only missing pieces
# are installed).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
packages=(g++ cmake ninja-build pkg-config libgtest-dev libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libprotobuf-dev
  protobuf-compiler pybind11-dev python3-dev python3-numpy python3-pip python3-setuptools python3-wheel)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# With nvcc (CUDA in /usr/local/cuda) the GPU backends are built too; the cuDNN frontend headers come from
# Debian's trixie contrib suite, unpacked privately (scripts/fetch-deps.sh).
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
  # A mirror that cannot serve trixie contrib costs only the cudnn backend (CMake leaves it out), not the build.
  [ -d "$root/.deps/root/usr/include/cudnn_frontend" ] || "$root/scripts/fetch-deps.sh" \
    || echo "setup: could not fetch the cuDNN frontend headers; building without the cudnn backend"
fi
build=${RINGTRAIN_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$root/.deps/root/usr" >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
grep -E "ringtrain:" "$build.configure.log" || true
ninja -C "$build" -j"$(nproc)"
