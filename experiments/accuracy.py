"""Accuracy on held-out problems (docs/results.md): greedy, one token a step, on problems START
to END of the held-out stream, for each target given, at B = 4, 8 and 32, with the share of
answers that name the question's people and things. Problems 0-199 are the report's, which the
training recipes were chosen on; 200-1199 judged the copying target; 1200-2199 judged the
B = 32 phase (no recipe was chosen on them).

    python experiments/accuracy.py 200 1200 models/target tests/fixtures/sdar_target   # shipped, before copying
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cli import load  # noqa: E402
from decode import DecodeRule  # noqa: E402
from training.tasks import problems  # noqa: E402
from training.report import AfterAnswer, decode_problems  # noqa: E402

torch.set_num_threads(1)
start, end, targets = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
for path in targets:
    model, tok = load(path)
    tasks = [(tok.encode(f"Question: {p['question']}\nAnswer:"), p["question"], p["result"])
             for p in problems(end, "test")[start:]]
    for B in (4, 8, 32):
        rule = AfterAnswer(DecodeRule(model.config.mask_token_id, B), tok.eos_id)
        print(f"{path} B={B}: {decode_problems(model, tok, tasks, rule, f'{path} B={B}')}", flush=True)
