#!/usr/bin/env bash
# The GPU check in one command, its phases boxed in 420 s together (with the machine's start and
# one rerun after a fix, it fits a 15-minute GPU slot). In order:
#   lockstep  where compiled decoding parts from eager, forward by forward (tools/lockstep.py:
#             every compile configuration in turn, the embedded pair in fp32): the first forward
#             that differs is named in the first minutes;
#   exact     compiled == eager in fp32 for every method (bench.py --compile both: its "= eager"
#             at 100%, or exit 1), the same attention on both sides (cli.attention);
#   costs     an SDAR-8B-shaped model's own costs (random weights built on the meta device, bf16,
#             static shapes and CUDA graphs): forwards of 4, 16, 64 and 256 query rows after
#             1,024 cached rows, one host sync, the floor; then the 1.7B drafter's shape if the
#             box has time (tools/gpu_costs.py; JSON per shape);
#   profile   the 8B 4-row forward by op (compiled without CUDA graphs, whose replay hides kernels);
#   batch     many prompts together with static shapes (serve/batch.py's buckets: one attention
#             call a forward, CUDA graphs): sample.py --prompts-file --batch 4 --compile static in
#             fp32, whose warm-up fails unless batched compiled == batched eager;
#   bench     the embedded pair in bf16, the main methods eager and compiled, one interleaved run;
#   summary   the files read back: "= eager" in fp32 and bf16 next to eager's own bf16-vs-fp32
#             agreement, the costs, the profile's top ops, the batch's totals.
# Dropped for time (each has run past its box before): the eager speed of light, the round costs
# and tests/test_cuda.py (run them by hand). Each phase has a time box, so a slow compile costs
# its own figures only, and writes its files as it goes: a later time-out keeps them. Figures go
# to stdout and, as files, to ${OUT:-gpu_out} (git ignores it).
#
#   bash gpu_check.sh                      # on a GPU
#   PHASES=exact,summary bash gpu_check.sh # only the named phases, in the order above
#   bash gpu_check.sh --dry-run            # the same phases on the CPU, in seconds: fp32, 1 prompt,
#                                          # B = 4, the $DRY_PRESET shape (default tiny-moe), no
#                                          # torch.compile, no time boxes (the flow, not the speed)
# PYTHON picks the interpreter (default: python); PHASE_LIMIT=S boxes every phase in S seconds
# instead; ATTENTION=flex|sdpa gives every phase's decoding that --attention (default: the
# command lines' own). Exit status: 0 when every phase run passed.
set -uo pipefail
cd "$(dirname "$0")"
die() { echo "error: $*" >&2; exit 2; }

dry=0
for arg in "$@"; do
    case $arg in
        --dry-run) dry=1 ;;
        -h|--help) sed -n '2,32s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) die "unknown flag $arg (gpu_check.sh takes only --dry-run)" ;;
    esac
done
BOXES=(lockstep:85 exact:85 costs:100 profile:30 batch:55 bench:55 summary:10)   # seconds, 420 at most
total=0 names=()
for b in "${BOXES[@]}"; do total=$(( total + ${b#*:} )) names+=("${b%%:*}"); done
[ $total -le 420 ] || die "the phases' time boxes add up to $total s, over 420"
all=$(IFS=,; echo "${names[*]}")
wanted=,${PHASES:-$all},
for p in $(tr , ' ' <<<"${PHASES:-}"); do
    [[ ,$all, == *,$p,* ]] || die "PHASES: unknown phase '$p'; choose from $all"
done
[[ ${PHASE_LIMIT:-1} =~ ^[1-9][0-9]*$ ]] || die "PHASE_LIMIT must be a whole number of seconds >= 1, got '$PHASE_LIMIT'"
[[ ${ATTENTION:-flex} =~ ^(flex|sdpa)$ ]] || die "ATTENTION must be flex or sdpa, got '$ATTENTION'"
attn=(${ATTENTION:+--attention $ATTENTION})
py=${PYTHON:-python}
command -v "$py" >/dev/null || die "no Python interpreter '$py' (set PYTHON)"
command -v timeout >/dev/null || die "no 'timeout' command (coreutils)"
"$py" -c "import torch, sentencepiece, safetensors, tqdm, pytest, xdist" 2>/dev/null \
    || die "$py cannot import torch, sentencepiece, safetensors, tqdm, pytest and xdist: run the README's set-up"
out=${OUT:-gpu_out}
mkdir -p "$out" 2>/dev/null && [ -w "$out" ] || die "cannot write to OUT=$out"

methods=threshold,simsd-lossless+threshold,spiffy+threshold
if [ $dry = 1 ]; then   # the flow, flags and parsing, not the figures: no GPU, no compiler
    export TORCH_COMPILE_DISABLE=1
    shape=${DRY_PRESET:-tiny-moe}
    dev=(--device cpu) boxed=0 exact=(--prompts 1 --max-new-tokens 8) bench=(--prompts 1 --max-new-tokens 8) sizes=4
    lockstep=(--configs eager-flex --block-size 4)   # flex needs torch.compile (on)
    costs=(--shapes $shape --rows 4,16 --cache-len 64 --iters 2 --dtype float32)
    many=(--max-new-tokens 8) n_many=2
    profile=(--shapes $shape --rows 4 --cache-len 64 --iters 2 --dtype float32)
else
    "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
        || die "torch $("$py" -c 'import torch; print(torch.__version__)') sees no GPU (on a CPU: --dry-run)"
    dev=(--device cuda) boxed=1 exact=(--prompts 4) bench=(--prompts 8) sizes=4,32
    lockstep=(--budget 70)
    costs=(--shapes sdar-8b,sdar-1.7b --budget 50) profile=(--shapes sdar-8b --rows 4 --iters 10)
    many=(--max-new-tokens 32) n_many=8
    export TORCH_LOGS=${TORCH_LOGS-recompiles,perf_hints}   # perf_hints: why a CUDA graph was skipped
fi
box() { for b in "${BOXES[@]}"; do [ "${b%%:*}" = "$1" ] && echo "${b#*:}"; done; }
failed=()
phase() {   # phase NAME LOG COMMAND...: COMMAND in NAME's time box (PHASE_LIMIT if set; none on a
    local name=$1 limit=$(( boxed * $(box "$1") )) log=$2 rc   # dry run), its stdout also to LOG unless -
    [[ $wanted == *,$name,* ]] || return 0
    limit=${PHASE_LIMIT:-$limit}
    shift 2
    echo "=== $name ($([ "$limit" = 0 ] && echo "no time box" || echo "at most ${limit} s"))"
    local t0=$SECONDS
    timeout "$limit" "$@" | tee "${log/#-//dev/null}"
    rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $(( SECONDS - t0 )) s"
    [ $rc = 0 ] || failed+=("$name (exit $rc$([ $rc = 124 ] && echo ', timed out'))")
}

"$py" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
phase lockstep "$out/gpu_lockstep.txt" env -u TORCH_COMPILE_DISABLE "$py" -u tools/lockstep.py "${lockstep[@]}"
phase exact - "$py" bench.py "${dev[@]}" --dtype float32 --compile both --block-size 4 "${exact[@]}" \
    --methods $methods "${attn[@]}" --out "$out/gpu_exact_fp32.json"
phase costs - "$py" -u tools/gpu_costs.py "${dev[@]}" "${costs[@]}" "${attn[@]}" --out "$out"
phase profile - "$py" tools/gpu_costs.py --profile "${dev[@]}" "${profile[@]}" "${attn[@]}" --out "$out"
[[ $wanted != *,batch,* ]] || "$py" -c "import json, sys; from training.tasks import problems
for p in problems(int(sys.argv[1]), 'test'): print(json.dumps(dict(question=f\"Question: {p['question']}\\nAnswer:\")))" \
    $n_many >"$out/prompts.jsonl" || die "could not write $out/prompts.jsonl"
phase batch "$out/gpu_batch.jsonl" "$py" sample.py "${dev[@]}" --dtype float32 --compile static --spec simsd \
    --prompts-file "$out/prompts.jsonl" --batch 4 "${many[@]}" "${attn[@]}" --json
phase bench - "$py" bench.py "${dev[@]}" --dtype bfloat16 --compile both --block-size $sizes "${bench[@]}" \
    --methods $methods "${attn[@]}" --out "$out/gpu_bench.json"
phase summary - "$py" - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
read = lambda name: json.loads((out / name).read_text()) if (out / name).is_file() else None
exact, bench = read("gpu_exact_fp32.json"), read("gpu_bench.json")
fp32_eager = {(r["method"], r["block_size"]): r["output_digests"] for r in (exact or {}).get("results", [])}
for name, run in (("exact (fp32)", exact), ("bench (bf16)", bench)):
    if run is None:
        print(f"{name}: no file"); continue
    print(f"{name}: {run['device']}, torch {run['torch']}, {run['date']}, attention {run['attention']}, "
          f"lossless ok: {run['lossless_ok']}, compile: {run.get('dynamo') or '-'}"
          + ("" if run.get("complete") else ", INCOMPLETE: the block sizes that finished"))
    for r in run["results"]:   # x threshold: against threshold compiled alike
        eager = f"{r['speedup_vs_eager']:.2f}x eager" if "speedup_vs_eager" in r else ""
        agree = f", {r['same_as_eager']:.0%} = eager" if "same_as_eager" in r else ""
        ref = fp32_eager.get((r["method"], r["block_size"])) if run is bench else None
        if ref and not r["method"].endswith(" compiled"):   # eager bf16 against eager fp32
            same = [a == b for a, b in zip(r["output_digests"], ref)]
            agree += f", {sum(same) / len(same):.0%} = fp32 eager ({len(same)} prompts)"
        print(f"  B={r['block_size']:<2} {r['method']:<35} {r['tokens_per_s']:8.1f} tok/s  "
              f"{r['speedup_vs_threshold']:.2f}x threshold  {eager:>10}  "
              f"{r['tokens_per_target_fwd']:.2f} tokens/target forward{agree}")
for path in sorted(out.glob("costs_*.json")):
    c = json.loads(path.read_text())
    print(f"costs {c['shape']} ({c['device']}, torch {c['torch']}, triton {c['triton']}, {c['dtype']}, "
          f"{c['date']}): floor {1e3 * c['floor_s']:.3f} ms, one sync {1e6 * c['sync_s']:.1f} us; "
          + ", ".join(f"{r['rows']} rows {1e3 * r['seconds']:.3f} ms ({r['x_floor']:.2f}x)" for r in c["rows"]))
many = out / "gpu_batch.jsonl"
print("batch:", many.read_text().splitlines()[-1] if many.is_file() and many.stat().st_size else "no file")
for path in sorted(out.glob("profile_*.txt")):
    print(*path.read_text().splitlines()[:12], sep="\n")
lockstep = out / "gpu_lockstep.txt"
print(*lockstep.read_text().splitlines()[-3:] if lockstep.is_file() else ["lockstep: no file"], sep="\n")
EOF
if [ ${#failed[@]} = 0 ]; then
    echo "gpu_check: every phase passed"
else
    echo "gpu_check: ${#failed[@]} phase(s) failed: ${failed[*]}"
    exit 1
fi
