#!/usr/bin/env bash
# The GPU check in one command, within 10 minutes on one GPU: the CUDA tests, the bench on the
# embedded pair in bf16 (eager, then compiled: static shapes, CUDA graphs), the speed-of-light
# figures of an SDAR-8B-shaped model (eager and compiled), then a summary read back from the
# JSON files. Each phase has a time box, so a slow compile costs its own figures only. Figures
# go to stdout and, as JSON, to ${OUT:-.}.
#
#   bash gpu_check.sh              # on a GPU
#   bash gpu_check.sh --dry-run    # the same phases in the same order on the CPU, in seconds:
#                                  # fp32, 1 prompt, B = 4, the tiny preset, no torch.compile,
#                                  # no time boxes (it tests the flow, not the speed)
# PYTHON picks the interpreter (default: python); PHASE_LIMIT=S boxes every phase in S seconds
# instead. Exit status: 0 when every phase passed.
set -uo pipefail
cd "$(dirname "$0")"
die() { echo "error: $*" >&2; exit 2; }

dry=0
for arg in "$@"; do
    case $arg in
        --dry-run) dry=1 ;;
        -h|--help) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) die "unknown flag $arg (gpu_check.sh takes only --dry-run)" ;;
    esac
done
[[ ${PHASE_LIMIT:-1} =~ ^[1-9][0-9]*$ ]] || die "PHASE_LIMIT must be a whole number of seconds >= 1, got '$PHASE_LIMIT'"
py=${PYTHON:-python}
command -v "$py" >/dev/null || die "no Python interpreter '$py' (set PYTHON)"
command -v timeout >/dev/null || die "no 'timeout' command (coreutils)"
"$py" -c "import torch, sentencepiece, safetensors, tqdm, pytest, xdist" 2>/dev/null \
    || die "$py cannot import torch, sentencepiece, safetensors, tqdm, pytest and xdist: run the README's set-up"
out=${OUT:-.}
mkdir -p "$out" 2>/dev/null && [ -w "$out" ] || die "cannot write to OUT=$out"

if [ $dry = 1 ]; then   # the flow, flags and parsing, not the figures: no GPU, no compiler
    export TORCH_COMPILE_DISABLE=1
    dev=(--device cpu --dtype float32) sol=tiny boxed=0 bench=(--prompts 1 --max-new-tokens 8) sizes=4
    tests=()
else
    "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
        || die "torch $("$py" -c 'import torch; print(torch.__version__)') sees no GPU (on a CPU: --dry-run)"
    dev=(--device cuda --dtype bfloat16) sol=sdar-8b boxed=1 bench=(--prompts 20) sizes=4,32 tests=()
fi
methods=sdar,plain,threshold,simsd-lossless+threshold,spiffy+static,spiffy+threshold
failed=()
phase() {   # phase NAME SECONDS LOG COMMAND...: COMMAND in its time box (PHASE_LIMIT if set; none
    local name=$1 limit=$(( boxed * $2 )) log=$3 rc   # on a dry run), its stdout also to LOG unless -
    limit=${PHASE_LIMIT:-$limit}
    shift 3
    echo "=== $name ($([ "$limit" = 0 ] && echo "no time box" || echo "at most ${limit} s"))"
    local t0=$SECONDS
    timeout "$limit" "$@" | tee "${log/#-//dev/null}"
    rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $(( SECONDS - t0 )) s"
    [ $rc = 0 ] || failed+=("$name (exit $rc$([ $rc = 124 ] && echo ', timed out'))")
}

"$py" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
phase tests 150 - "$py" -m pytest -q -n 0 -p no:cacheprovider tests/test_cuda.py tests/test_syncs.py "${tests[@]}"
phase bench-eager 60 - "$py" bench.py "${dev[@]}" --block-size $sizes "${bench[@]}" --methods $methods \
    --out "$out/gpu_bench_eager.json"
phase bench-compiled 180 - "$py" bench.py "${dev[@]}" --compile --block-size $sizes "${bench[@]}" \
    --methods $methods --out "$out/gpu_bench_compiled.json"
phase sol-eager 60 "$out/gpu_sol_eager.txt" "$py" bench.py --speed-of-light $sol "${dev[@]}"
phase sol-compiled 120 "$out/gpu_sol_compiled.txt" "$py" bench.py --speed-of-light $sol "${dev[@]}" --compile
phase summary 30 - "$py" - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for run in ("eager", "compiled"):
    path = out / f"gpu_bench_{run}.json"
    if not path.is_file():
        print(f"bench {run}: no {path.name}"); continue
    bench = json.loads(path.read_text())
    print(f"bench {run} ({bench['device']}, torch {bench['torch']}, {bench['date']}), "
          f"lossless ok: {bench['lossless_ok']}, compile: {bench['dynamo'] or '-'}")
    rows = {(r["block_size"], r["method"]): r for r in bench["results"]}
    for (B, m), r in rows.items():
        thr = rows.get((B, "threshold"))
        vs = f"{r['tokens_per_s'] / thr['tokens_per_s']:.2f}x threshold" if thr else ""
        print(f"  B={B:<2} {m:<26} {r['tokens_per_s']:8.1f} tok/s  {vs:>16}  "
              f"{r['tokens_per_target_fwd']:.2f} tokens/target forward")
for run in ("eager", "compiled"):
    path = out / f"gpu_sol_{run}.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    if not lines or not lines[-1].startswith("{"):
        print(f"speed of light {run}: no result"); continue
    print(f"speed of light {run}:", *lines[:-1], sep="\n")
EOF
if [ ${#failed[@]} = 0 ]; then
    echo "gpu_check: every phase passed"
else
    echo "gpu_check: ${#failed[@]} phase(s) failed: ${failed[*]}"
    exit 1
fi
