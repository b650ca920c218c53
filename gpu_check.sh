#!/usr/bin/env bash
# The GPU check in one command (meant to fit 10 minutes on one H200; not run yet): the CUDA
# tests, the bench on the embedded pair compiled in bf16, and the speed-of-light figures of an
# SDAR-8B-shaped model, eager and compiled (CUDA graphs). Figures go to stdout and, as JSON, to ${OUT:-.}.
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-.}
python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
python -m pytest -q tests/test_cuda.py tests/test_syncs.py tests/test_compile.py tests/test_model.py tests/test_spiffy.py
python bench.py --device cuda --dtype bfloat16 --compile --block-size 4,8,32 --prompts 40 \
    --methods sdar,plain,threshold,simsd-gated,simsd-lossless,simsd-lossless+threshold,spiffy,spiffy+threshold --out "$out/gpu_bench.json"
python bench.py --speed-of-light sdar-8b --device cuda --dtype bfloat16 | tee "$out/gpu_sol.txt"
python bench.py --speed-of-light sdar-8b --device cuda --dtype bfloat16 --compile | tee -a "$out/gpu_sol.txt"
