#!/usr/bin/env bash
# The GPU check in one command, its phases boxed in 450 s together (a rerun fits a 15-minute
# lease). First, where compiled decoding parts from eager, forward by forward
# (tools/lockstep.py: every compile configuration in turn, the embedded pair in fp32, stale
# cache rows filled with garbage), so that a wrong compiled path is named in the first minutes;
# then the CUDA tests, the bench on the embedded pair in bf16 (the main methods eager and
# compiled, static shapes and CUDA graphs, in one interleaved run; its JSON written a block
# size at a time), the speed-of-light figures of an SDAR-8B-shaped model (eager; compiled: its
# B = 4 forward), where a round's time goes (experiments/round_costs.py), then a summary of
# the files. Each phase has a time box, so a slow compile costs its own figures only;
# recompiles and skipped CUDA graphs are logged (TORCH_LOGS). Figures go to stdout and, as
# files, to ${OUT:-gpu_out} (git ignores it).
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
        -h|--help) sed -n '2,19s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) die "unknown flag $arg (gpu_check.sh takes only --dry-run)" ;;
    esac
done
[[ ${PHASE_LIMIT:-1} =~ ^[1-9][0-9]*$ ]] || die "PHASE_LIMIT must be a whole number of seconds >= 1, got '$PHASE_LIMIT'"
py=${PYTHON:-python}
command -v "$py" >/dev/null || die "no Python interpreter '$py' (set PYTHON)"
command -v timeout >/dev/null || die "no 'timeout' command (coreutils)"
"$py" -c "import torch, sentencepiece, safetensors, tqdm, pytest, xdist" 2>/dev/null \
    || die "$py cannot import torch, sentencepiece, safetensors, tqdm, pytest and xdist: run the README's set-up"
out=${OUT:-gpu_out}
mkdir -p "$out" 2>/dev/null && [ -w "$out" ] || die "cannot write to OUT=$out"

if [ $dry = 1 ]; then   # the flow, flags and parsing, not the figures: no GPU, no compiler
    export TORCH_COMPILE_DISABLE=1
    dev=(--device cpu --dtype float32) sol=tiny boxed=0 bench=(--prompts 1 --max-new-tokens 8) sizes=4 costs=1
    tests=() lockstep=(--configs eager-flex --block-size 4)   # flex needs torch.compile (on)
else
    "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
        || die "torch $("$py" -c 'import torch; print(torch.__version__)') sees no GPU (on a CPU: --dry-run)"
    dev=(--device cuda --dtype bfloat16) sol=sdar-8b boxed=1 bench=(--prompts 8) sizes=4,32 costs=8 tests=() lockstep=(--budget 100)
    export TORCH_LOGS=${TORCH_LOGS-recompiles,perf_hints}   # perf_hints: why a CUDA graph was skipped
fi
methods=threshold,simsd-lossless+threshold,spiffy+threshold
BOXES=(lockstep:150 tests:60 bench:130 sol-eager:20 sol-compiled:45 round-costs:35 summary:10)   # seconds, 450 at most
total=0
for box in "${BOXES[@]}"; do total=$(( total + ${box#*:} )); done
[ $total -le 450 ] || die "the phases' time boxes add up to $total s, over 450"
box() { for b in "${BOXES[@]}"; do [ "${b%%:*}" = "$1" ] && echo "${b#*:}"; done; }
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
phase lockstep "$(box lockstep)" "$out/gpu_lockstep.txt" env -u TORCH_COMPILE_DISABLE "$py" -u tools/lockstep.py "${lockstep[@]}"
phase tests "$(box tests)" - "$py" -m pytest -q -x -n 0 -p no:cacheprovider tests/test_cuda.py "${tests[@]}"
phase bench "$(box bench)" - "$py" bench.py "${dev[@]}" --compile both --block-size $sizes "${bench[@]}" \
    --methods $methods --out "$out/gpu_bench.json"
phase sol-eager "$(box sol-eager)" "$out/gpu_sol_eager.txt" "$py" bench.py --speed-of-light $sol "${dev[@]}"
phase sol-compiled "$(box sol-compiled)" "$out/gpu_sol_compiled.txt" "$py" bench.py --speed-of-light $sol \
    "${dev[@]}" --compile --quick       # the B = 4 forward alone: one graph of the 8B model
phase round-costs "$(box round-costs)" "$out/gpu_round_costs.txt" "$py" experiments/round_costs.py "${dev[@]}" \
    --prompts $costs --block-size 4
phase summary "$(box summary)" - "$py" - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
path = out / "gpu_bench.json"
if path.is_file():
    bench = json.loads(path.read_text())
    print(f"bench ({bench['device']}, torch {bench['torch']}, {bench['date']}), "
          f"lossless ok: {bench['lossless_ok']}, compile: {bench.get('dynamo') or '-'}"
          + ("" if bench.get("complete") else ", INCOMPLETE: the block sizes that finished"))
    for r in bench["results"]:   # x threshold: against threshold compiled alike
        eager = f"{r['speedup_vs_eager']:.2f}x eager" if "speedup_vs_eager" in r else ""
        print(f"  B={r['block_size']:<2} {r['method']:<35} {r['tokens_per_s']:8.1f} tok/s  "
              f"{r['speedup_vs_threshold']:.2f}x threshold  {eager:>10}  "
              f"{r['tokens_per_target_fwd']:.2f} tokens/target forward"
              + (f", {r['same_as_eager']:.0%} as eager" if "same_as_eager" in r else ""))
else:
    print(f"bench: no {path.name}")
path = out / "gpu_round_costs.txt"
print(*path.read_text().splitlines() if path.is_file() else [f"round costs: no {path.name}"], sep="\n")
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
