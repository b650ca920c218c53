"""Accuracy on more held-out problems than the report's 200 (docs/results.md, "Copying the
question's people and things"): greedy, one token a step, on problems 200 to N of the held-out
stream, which no training recipe was chosen on, for each target given, at B = 4, 8 and 32.

    python docs/accuracy.py 1200 models/target tests/fixtures/sdar_target   # shipped, before copying
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cli import load  # noqa: E402
from decode import DecodeRule  # noqa: E402
from prepare import problems  # noqa: E402
from report import AfterAnswer, decode_problems  # noqa: E402

torch.set_num_threads(1)
n, targets = int(sys.argv[1]), sys.argv[2:]
for path in targets:
    model, tok = load(path)
    tasks = [(tok.encode(f"Question: {p['question']}\nAnswer:"), p["question"], p["result"])
             for p in problems(n, "test")[200:]]
    for B in (4, 8, 32):
        rule = AfterAnswer(DecodeRule(model.config.mask_token_id, B), tok.eos_id)
        print(f"{path} B={B}: {decode_problems(model, tok, tasks, rule, f'{path} B={B}')}", flush=True)
