#!/usr/bin/env bash
# Unpacks the header-only dependencies into .deps/root (git-ignored) for machines where packages cannot be
# installed (the GPU machine): CLI11, nlohmann-json (bookworm) and the cuDNN frontend (trixie contrib, the
# only Debian suite that packages it). Needs apt-get and a reachable Debian mirror; changes nothing outside
# .deps. Run here, then carry .deps to the device machine.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=$PWD/.deps
mkdir -p "$deps/apt/lists/partial" "$deps/deb" "$deps/root"
src=/etc/apt/sources.list.d/debian.sources
# The machine's own mirror, with the suite and component swapped.
awk 'BEGIN{RS="";ORS="\n\n"} NR==1' "$src" | sed 's/^Suites:.*/Suites: bookworm/; s/^Components:.*/Components: main/' \
  > "$deps/apt/bookworm-main.sources"
awk 'BEGIN{RS="";ORS="\n\n"} NR==1' "$src" | sed 's/^Suites:.*/Suites: trixie/; s/^Components:.*/Components: contrib/' \
  > "$deps/apt/trixie-contrib.sources"
o=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$deps/apt" -o Dir::State::Lists="$deps/apt/lists")
apt-get "${o[@]}" -qq update
(cd "$deps/deb" && apt-get "${o[@]}" -qq download libcli11-dev nlohmann-json3-dev libcudnn-frontend-dev)
for f in "$deps"/deb/*.deb; do dpkg -x "$f" "$deps/root"; done
echo "dependencies unpacked in $deps/root/usr (include: $(ls "$deps/root/usr/include" | tr '\n' ' '))"
