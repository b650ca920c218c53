"""The modelled GPU column (sol.GPU_MODEL) with and without what a forward count leaves out: the
same runs priced by forwards alone (weight reads or compute, the model before 2026-12-04), then
with each model's launch-bound floor and the host syncs the decoders make (counted by
decode.to_host). Counts are exact: the figures repeat run to run. It prints a row a method
and block size: target-forward equivalents per token each way, and syncs a forward.

    python experiments/gpu_model.py --prompts 40   # held-out problems, B = 4 and 8, threshold rule
    python experiments/gpu_model.py --prompts 1 --block-size 4 --max-new-tokens 8   # seconds
"""
import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cli  # noqa: E402
from bench import runner  # noqa: E402
from loading import util  # noqa: E402
from measure.graphs import graphs_for  # noqa: E402
from measure.sol import GPU_MODEL, modelled_gpu_cost  # noqa: E402
from training.tasks import calibration_prompts, load_tasks  # noqa: E402

SMOKE = "--prompts 1 --block-size 4 --max-new-tokens 8"
SMOKE_OUTPUT = r"spiffy\+threshold +4 +\d+\.\d{3} +\d+\.\d{3} +\d+\.\d\d"
METHODS = ("threshold", "simsd-lossless+threshold", "spiffy+threshold")


def priced(run, tasks, n_new):
    """One method on every task -> (cost by forwards only, with floors and syncs, syncs a
    forward)."""
    rows, rows_draft, tokens, syncs, nfe = Counter(), Counter(), 0, 0, 0
    for ids, _ in tasks:
        st = run(ids, n_new)[1]
        rows.update(st["rows"]), rows_draft.update(st.get("rows_draft", {}))
        tokens, syncs, nfe = tokens + st["tokens"], syncs + st["syncs"], nfe + st["nfe"]
    forwards_only = dict(GPU_MODEL, layer_s=0.0, sync_s=0.0)
    old = modelled_gpu_cost(rows, rows_draft, tokens, gpu=forwards_only)
    return old, modelled_gpu_cost(rows, rows_draft, tokens, syncs), syncs / nfe


def main(prompts=40, block_sizes=(4, 8), max_new_tokens=64):
    util.check_positive(prompts=prompts, max_new_tokens=max_new_tokens)
    target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", block_sizes)
    tasks = load_tasks(None, prompts, tok, False, "arith")
    graphs = graphs_for(cli.DEFAULT_TARGET, target,
                        lambda: calibration_prompts(None, prompts, tok, False, []), [])
    print(f"{prompts} problems; target-forward equivalents per token, {GPU_MODEL['pair']}")
    print(f"{'method':<26} {'B':>2} {'forwards only':>14} {'+ floors, syncs':>16} {'syncs/fwd':>10}")
    for B in block_sizes:
        for method in METHODS:
            old, new, syncs = priced(runner(method, target, drafter, B, graphs), tasks,
                                     max_new_tokens)
            print(f"{method:<26} {B:>2} {old:>14.3f} {new:>16.3f} {syncs:>10.2f}")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=40, help="held-out problems")
    ap.add_argument("--block-size", default="4,8", help="comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()
    util.run(lambda: main(a.prompts, util.int_list(a.block_size, "--block-size"), a.max_new_tokens))
