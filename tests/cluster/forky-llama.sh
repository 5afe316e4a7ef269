#!/usr/bin/env bash
# The cluster test's llama.cpp: Debian forky's amd64 build of the packages the image carries
# (llama.cpp's llama-server, llama.cpp-tools-extra's ggml-rpc-server, libggml0-backend-rpc),
# installed into a root of its own with mmdebstrap, since forky's libraries are newer than this
# host's. The test runs them there with chroot. Usage: forky-llama.sh DIR (kept when present).
set -euo pipefail
dir=${1:?usage: forky-llama.sh DIR}
if [ -x "$dir/usr/bin/llama-server" ]; then
  exit 0
fi
# The Debian archive the host's apt sources name (one-line or deb822), unless given.
mirror=${APPLIANCE_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk '/^deb / && $2 !~ /security/ {print $2; exit} /^URIs:/ && $2 !~ /security/ {print $2; exit}' || true)
fi
[ -n "$mirror" ] || { echo "no Debian mirror in the host's apt sources; set APPLIANCE_DEBIAN_MIRROR" >&2; exit 2; }
tmp="$dir.partial"
rm -rf "$tmp"
# A snapshot's Release file may be past its Valid-Until: the packages are still the ones signed.
mmdebstrap --quiet --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' \
  --include=llama.cpp,llama.cpp-tools-extra,libggml0-backend-rpc \
  forky "$tmp" "deb ${mirror%/} forky main"
mv "$tmp" "$dir"
