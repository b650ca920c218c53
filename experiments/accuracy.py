"""Accuracy on held-out problems (docs/results.md): greedy, one token a step, on problems START
to END of the held-out stream, for each target given, at each block size, with the share of
answers that name the question's people and things. Problems 0-199 are the report's, which the
training recipes were chosen on; 200-1199 judged the copying target; 1200-2199 judged the
B = 32 phase (no recipe was chosen on them). It prints a line per target and block size:
accuracy, tokens a forward, the share of forwards after the answer, people and things.

    python experiments/accuracy.py --start 200 --end 1200 models/target tests/fixtures/sdar_target
    python experiments/accuracy.py --start 0 --end 2 --block-size 4   # seconds
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cli import DEFAULT_TARGET, check_block_size, load  # noqa: E402
from decode import DecodeRule  # noqa: E402
from loading import util  # noqa: E402
from training.report import AfterAnswer, decode_problems  # noqa: E402
from training.tasks import problems  # noqa: E402

SMOKE = "--start 0 --end 2 --block-size 4"
SMOKE_OUTPUT = r"models/target B=4: accuracy .*, \d+\.\d\d tokens per forward"


def main(targets=(DEFAULT_TARGET,), start=0, end=200, block_sizes=(4, 8, 32)):
    if not 0 <= start < end:
        raise ValueError(f"--start and --end must be 0 <= START < END, got {start} and {end}")
    torch.set_num_threads(1)
    for path in targets:
        model, tok = load(path)
        for B in block_sizes:
            check_block_size(model, B, "target")
        tasks = [(tok.encode(f"Question: {p['question']}\nAnswer:"), p["question"], p["result"])
                 for p in problems(end, "test")[start:]]
        for B in block_sizes:
            rule = AfterAnswer(DecodeRule(model.config.mask_token_id, B), tok.eos_id)
            figures = decode_problems(model, tok, tasks, rule, f"{path} B={B}")
            print(f"{path} B={B}: {figures}", flush=True)


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="*", default=[DEFAULT_TARGET],
                    help="checkpoint directories (default: the shipped target)")
    ap.add_argument("--start", type=int, default=0, help="the first held-out problem")
    ap.add_argument("--end", type=int, default=200, help="the problem after the last")
    ap.add_argument("--block-size", default="4,8,32", help="comma-separated")
    a = ap.parse_args()
    util.run(lambda: main(a.targets, a.start, a.end, util.int_list(a.block_size, "--block-size")))
