"""How often lookup's proposals are kept (counts, no timing): per prompt set and block size,
the rounds where lookup proposed something, and of the k-th proposed token, the share the
walk kept given the k-1 before it were kept. Every copy verified (no cost table). It prints a
line per prompt set and block size. The "text" set reads val_text.jsonl in --data-dir
(tools/prepare.py's output).

    python experiments/lookup_keep.py --prompts 40          # 40 prompts per set, B = 4, 8, 32
    python experiments/lookup_keep.py --prompts 1 --block-size 4 --max-new-tokens 8 --data-dir DIR
"""
import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import cli  # noqa: E402
import variants  # noqa: E402
from loading import util  # noqa: E402
from measure import counts  # noqa: E402
from training.tasks import load_tasks, speaker_prompts  # noqa: E402

SMOKE = "--prompts 1 --block-size 4 --max-new-tokens 8 --data-dir {data}"
SMOKE_OUTPUT = r"text  B= 4: proposed in \d+ of \d+ rounds; kept \| the ones before kept"
KINDS = ("arith", "copy", "text")


def prompt_sets(tok, n, data_dir):
    """kind -> the first n prompts' ids."""
    text = [tok.encode(q) for q, _ in speaker_prompts(n, Path(data_dir) / "val_text.jsonl")]
    if not text:
        raise ValueError(f"{data_dir}/val_text.jsonl holds no text with a speaker's line")
    return {kind: text if kind == "text" else [ids for ids, _ in load_tasks(None, n, tok, False, kind)]
            for kind in KINDS}


def kept_shares(model, prompts, rule, n_new):
    """Lookup on every prompt, Counts.lossless wrapped to see each round's proposals -> the
    line of figures."""
    real, kept, tried, rounds = counts.Counts.lossless, Counter(), Counter(), Counter()

    def lossless(self, g, w):   # a round's drafts accepted (a) of those proposed (of)
        before = dict(self.n)
        real(self, g, w)
        a = next((k[1] for k in self.n if k[0] == "accepted" and self.n[k] != before.get(k)), 0)
        of = max(g.drafted or [0])
        rounds["all"] += 1
        rounds["proposed"] += of > 0
        for k in range(min(a + 1, of)):
            tried[k] += 1
            kept[k] += k < a
    counts.Counts.lossless = lossless
    try:
        for ids in prompts:
            variants.simsd(model, None, ids, n_new, rule, reference="lookup")
    finally:
        counts.Counts.lossless = real
    rates = " ".join(f"{kept[k] / tried[k]:.2f}" for k in range(6) if tried[k])
    return (f"proposed in {rounds['proposed']} of {rounds['all']} rounds; "
            f"kept | the ones before kept, tokens 1-6: {rates}")


def main(prompts=40, block_sizes=(4, 8, 32), max_new_tokens=64, data_dir=ROOT / "data"):
    util.check_positive(prompts=prompts, max_new_tokens=max_new_tokens)
    torch.set_num_threads(1)
    model, tok = cli.load(cli.DEFAULT_TARGET)
    for B in block_sizes:
        cli.check_block_size(model, B, "target")
    for kind, ids in prompt_sets(tok, prompts, data_dir).items():
        for B in block_sizes:
            line = kept_shares(model, ids, cli.make_rule(model, B, cli.THRESHOLD), max_new_tokens)
            print(f"{kind:5s} B={B:2d}: {line}", flush=True)


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=40, help="prompts a set")
    ap.add_argument("--block-size", default="4,8,32", help="comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--data-dir", default=ROOT / "data", help="tools/prepare.py's output")
    a = ap.parse_args()
    util.run(lambda: main(a.prompts, util.int_list(a.block_size, "--block-size"),
                          a.max_new_tokens, a.data_dir))
