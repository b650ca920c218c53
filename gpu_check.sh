#!/usr/bin/env bash
# The GPU check in one command, within 10 minutes on one GPU (not run yet): the CUDA tests, the
# bench on the embedded pair in bf16 (eager, then compiled: static shapes, CUDA graphs), and
# the speed-of-light figures of an SDAR-8B-shaped model, eager and compiled. Each phase has a
# time box, so a slow compile costs its own figures only. Figures go to stdout and, as JSON,
# to ${OUT:-.}.
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-.}
methods=sdar,plain,threshold,simsd-lossless+threshold,spiffy,spiffy+threshold
python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
timeout 150 python -m pytest -q tests/test_cuda.py tests/test_syncs.py
timeout 60 python bench.py --device cuda --dtype bfloat16 --block-size 4,32 --prompts 20 \
    --methods $methods --out "$out/gpu_bench_eager.json"
timeout 180 python bench.py --device cuda --dtype bfloat16 --compile --block-size 4,32 --prompts 20 \
    --methods $methods --out "$out/gpu_bench_compiled.json"
timeout 60 python bench.py --speed-of-light sdar-8b --device cuda --dtype bfloat16 | tee "$out/gpu_sol.txt"
timeout 120 python bench.py --speed-of-light sdar-8b --device cuda --dtype bfloat16 --compile \
    | tee -a "$out/gpu_sol.txt"
