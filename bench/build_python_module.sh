#!/usr/bin/env bash
# Builds the Python module (python/*.cpp, the extension _core) for another interpreter than the one CMake found, from
# an existing build's libraries: for a GPU machine whose Python (3.12 there) has headers but none of this build's
# dependencies. The compile flags come from BUILD/compile_commands.json, the link line from BUILD/build.ninja; only
# the Python and pybind11 include folders and the extension's suffix change. The package (the .py files and the
# extension) goes to OUT/ringtrain.
#
#   bench/build_python_module.sh BUILD OUT EXT_SUFFIX PYBIND11_INCLUDE PYTHON_INCLUDE...
#   bench/build_python_module.sh build /tmp/py312 .cpython-312-x86_64-linux-gnu.so py312/pybind11 py312/python py312/plat
set -euo pipefail
[ $# -ge 5 ] || { sed -n 2,9p "$0"; exit 2; }
for f in compile_commands.json build.ninja; do
  [ -f "$1/$f" ] || { echo "build_python_module: $1/$f: no such file (a CMake + Ninja build folder)" >&2; exit 2; }
done
[ -f "$4/pybind11/pybind11.h" ] || { echo "build_python_module: $4/pybind11/pybind11.h: no such file" >&2; exit 2; }
build=$(realpath "$1") out=$2 suffix=$3 pybind=$(realpath "$4"); shift 4
for d in "$@"; do [ -d "$d" ] || { echo "build_python_module: $d: no such folder" >&2; exit 2; }; done
includes=""; for d in "$pybind" "$@"; do includes+=" -isystem $(realpath "$d")"; done
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/ringtrain" "$out/obj"
objs="" pids=""
for f in batch module ranks; do
  cmd=$(python3 - "$build" "$src/python/$f.cpp" <<'PY'
import json, re, sys
for e in json.load(open(sys.argv[1] + "/compile_commands.json")):
    if e["file"] == sys.argv[2]:
        c = re.sub(r"-isystem \S*python3\.\d+\S*", "", e["command"])
        print(re.sub(r" -o \S+ -c \S+", "", c))
        break
else:
    sys.exit("build_python_module: no compile command for " + sys.argv[2] + " (a build with the Python module on)")
PY
)
  (cd "$build" && $cmd $includes -o "$(realpath "$out")/obj/$f.o" -c "$src/python/$f.cpp") &
  pids+=" $!"
  objs+=" $(realpath "$out")/obj/$f.o"
done
for p in $pids; do wait "$p" || { echo "build_python_module: a compile failed" >&2; exit 1; }; done
link_var() { awk -v key="$1" '/^build python\/ringtrain\/_core/{f=1} f && $1 == key {sub(/^ *[A-Z_]+ = /,""); print; exit}' "$build/build.ninja"; }
libs=$(link_var LINK_LIBRARIES) paths=$(link_var LINK_PATH)
[ -n "$libs" ] || { echo "no link line for the module in $build/build.ninja" >&2; exit 1; }
(cd "$build" && c++ -O3 -flto=auto -shared -fPIC -o "$(realpath "$out")/ringtrain/_core$suffix" $objs $paths $libs)
strip "$out/ringtrain/_core$suffix"
cp "$src"/python/ringtrain/*.py "$out/ringtrain/"
echo "built $out/ringtrain/_core$suffix"
