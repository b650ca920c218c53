"""The drafter's loop (speculate.draft) against its device form (fast.draft, what the command
lines run) on the 96 runs of tests/test_counts_fixed.py: which tokens and counts move.

The two draft the same, call by call (tests/test_fast.py); the loop stops at the drafter's
stop, the device form runs its fixed number of forwards. The drafter's stream is seeded afresh
each round, so the draws a round skips leave later rounds alone: every token and target count
should stay, sampled runs too, and only the drafter's forwards fall. (2026-12-06: 64 SimSD
runs, nothing moved, drafter forwards 859 -> 760. With one stream for the whole run, 1 run's
tokens and 4 runs' target counts moved, all sampled.)

    python experiments/draft_loop.py
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import fast  # noqa: E402
import speculate  # noqa: E402
import test_counts_fixed as fixed  # noqa: E402

torch.set_num_threads(1)
recorded, device_form = fixed.recorded(), fast.draft
runs = moved_tokens = moved_counts = 0
forwards = [0, 0]
for k in range(fixed.N_RUNS):
    s = fixed.settings(k)
    if not s["method"].startswith("simsd"):
        continue
    fast.draft = speculate.draft            # (run() passes draft=fast.draft)
    try:
        out, counts = fixed.run(s)
    finally:
        fast.draft = device_form
    want, runs = recorded[k], runs + 1
    moved = [key for key in counts if counts[key] != want["counts"].get(key)
             and key not in ("nfe_draft", "rows_draft")]
    moved_tokens, moved_counts = moved_tokens + (out != want["tokens"]), moved_counts + bool(moved)
    forwards = [forwards[0] + want["counts"]["nfe_draft"], forwards[1] + counts["nfe_draft"]]
    if moved or out != want["tokens"]:
        print(f"run {k} ({s['method']}, temperature {s['temperature']}): "
              f"{', '.join(['tokens'] * (out != want['tokens']) + moved)} moved")
print(f"{runs} SimSD runs: tokens moved in {moved_tokens}, target counts in {moved_counts}; "
      f"drafter forwards {forwards[0]} (fast.draft) -> {forwards[1]} (the loop)")
