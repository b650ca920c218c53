"""Spiffy's draft graphs as files, the offline step before Spiffy decodes (sample.py --spec
spiffy, bench.py; docs/design.md, section 4): `spiffy.calibrate` on a set of prompts (plain
decoding's trajectories, the reveal sets seen 1 to 6 steps after each state, the D most
frequent, kept connected to the root under a one-token rule), written as a small JSON file next
to the target's weights, one per block size and decoding rule, that `measure.graphs.load_graph`
reads (bench.py calibrates a missing one in memory: `measure.graphs.graphs_for`).

    python tools/calibrate.py               # models/target/spiffy_graph_b{4,8,32}_{static,t0.9}.json
    python tools/calibrate.py --strategy sequential --block-size 8   # another SDAR strategy
    python tools/calibrate.py --target ~/SDAR-8B-Chat --block-size 4 --threshold 0.9 \\
        --data gsm8k_calib.jsonl --chat --prompts 25   # a chat model, on prompts like its task
"""
import argparse
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from loading import util  # noqa: E402
from cli import check_block_size, load, make_rule  # noqa: E402
from decode import EB_THRESHOLD, STRATEGIES  # noqa: E402
from training.tasks import problems  # noqa: E402
from spiffy import calibrate  # noqa: E402
from measure.graphs import graph_path  # noqa: E402

SMOKE = "--target {target} --block-size 4 --prompts 1"
SMOKE_OUTPUT = r"spiffy_graph_b4_t0\.9\.json: \d+ nodes from 1 prompts"


def main(target="models/target", block_sizes=(4, 8, 32), threshold=None, prompts=50, budget=16,
         max_new_tokens=64, strategy=None, eb_threshold=EB_THRESHOLD, data=None, chat=False):
    """Calibrate and save a graph per (block size, rule) next to the target's weights: the
    static and threshold (0.9) rules, or the threshold rule at `threshold`, or one other of
    SDAR's strategies. Prompts: the first `prompts` training-split problems, or the first
    `prompts` of `data` (JSONL with "question"; in the checkpoint's chat template with
    `chat`), which should look like what the graph will decode. Every flag, the target,
    each block size and the data are checked before the first graph is written; each graph
    file is replaced whole."""
    util.check_positive(prompts=prompts, budget=budget, max_new_tokens=max_new_tokens)
    for B in block_sizes:
        util.check_positive(block_size=B)
    if threshold is not None and strategy not in (None, "low_confidence_dynamic"):
        raise ValueError(f"--threshold applies to the threshold rule, not --strategy {strategy}")
    if chat and data is None:
        raise ValueError("--chat needs --data: the project's own problems are not chat prompts")
    texts = ([r["question"] for _, r in util.read_prompts(data, "--data", stop=prompts)] if data else
             [f"Question: {p['question']}\nAnswer:" for p in problems(prompts, "train")])
    if not texts:
        raise ValueError(f"--data file {data} holds no prompts")
    model, tok = load(target)
    for B in block_sizes:
        check_block_size(model, B, "target")
    util.check_writable(target, "--target", folder=True)
    ids = [tok.encode(tok.apply_chat_template(t) if chat else t) for t in texts]
    rules = [(threshold, strategy)] if threshold or strategy else [(None, None), (0.9, None)]
    for B in block_sizes:
        for th, strat in rules:
            rule = make_rule(model, B, th, strategy=strat, eb_threshold=eb_threshold)
            t0 = time.perf_counter()
            g = calibrate(model, tqdm(ids, desc=f"calibrate B={B} {rule.strategy}", leave=False), rule,
                          max_new_tokens, budget)
            path = graph_path(target, rule)
            with util.atomic_write(path) as tmp:
                tmp.write_text(json.dumps(g) + "\n")
            print(f"{path}: {len(g['nodes'])} nodes from {len(ids)} prompts in "
                  f"{time.perf_counter() - t0:.1f} s, most frequent {g['nodes'][:3]} x {g['counts'][:3]}")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/target", help="checkpoint directory; the graphs "
                    "are written next to its weights")
    ap.add_argument("--block-size", default="4,8,32", help="comma-separated")
    ap.add_argument("--data", default=None, help="JSONL with a \"question\" per line: calibrate on "
                    "these prompts (default: the project's training-split problems)")
    ap.add_argument("--chat", action="store_true", help="--data's prompts in the checkpoint's chat template")
    ap.add_argument("--prompts", type=int, default=50, help="prompts to run (the first N)")
    ap.add_argument("--budget", type=int, default=16, help="D: nodes kept in the graph")
    ap.add_argument("--threshold", type=float, default=None,
                    help="calibrate the threshold rule at this confidence only (default: the "
                         "static rule and the threshold rule at 0.9)")
    ap.add_argument("--strategy", default=None, choices=STRATEGIES,
                    help="calibrate for this SDAR strategy only")
    ap.add_argument("--eb-threshold", type=float, default=EB_THRESHOLD, help="entropy_bounded's bound")
    a = ap.parse_args()
    util.run(lambda: main(a.target, util.int_list(a.block_size, "--block-size"), a.threshold,
                          a.prompts, a.budget, strategy=a.strategy, eb_threshold=a.eb_threshold,
                          data=a.data, chat=a.chat))
