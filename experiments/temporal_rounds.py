"""Why a lookup round on the temporal mask is worth less than the rule's own step (docs/results.md,
"Copies bought at their price"): positions revealed a round, by how the round ended, against the
threshold rule's own reveals a step decoding the same training problems alone (both counted as
positions a step reveals, stop ids and max tokens aside). If the rounds that reject a draft
revealed as much as the rule's step, the cause written there would be wrong.

    python experiments/temporal_rounds.py --problems 80 --block-size 4,32
    python experiments/temporal_rounds.py --problems 2 --block-size 4      # seconds
"""
import argparse
import dataclasses
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import speculate  # noqa: E402
from decode import generate  # noqa: E402
from loading import util  # noqa: E402
from training.tasks import problems  # noqa: E402
from variants import simsd  # noqa: E402

SMOKE = "--problems 2 --block-size 4"
SMOKE_OUTPUT = r"B=4 lookup: the rule alone \d+\.\d\d a step; .*nothing drafted: \d+ rounds, \d+\.\d\d"


def revealed(before, after, mask_id):
    return int((before == mask_id).sum() - (after == mask_id).sum())


def main(n_problems=80, block_sizes=(4, 32), reference="lookup"):
    util.check_positive(problems=n_problems)
    target, tok, _ = cli.load_models(cli.DEFAULT_TARGET, None, block_sizes)
    prompts = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(n_problems, "train")]
    accept = speculate.accept_temporal
    for B in block_sizes:
        rule, by, alone = cli.make_rule(target, B, cli.THRESHOLD), defaultdict(list), []

        def counted(logits, front, d, rule_, generator=None):
            block, k = accept(logits, front, d, rule_, generator)
            why = "nothing drafted" if not d.pos else "all accepted" if int(k) == len(d.pos) else "rejected"
            by[why].append(revealed(front.block, block, rule_.mask_id))
            return block, k

        class Counted(type(rule)):   # the rule alone, its reveals a step counted
            def __call__(self, logits, block, step, generator=None):
                new = super().__call__(logits, block, step, generator)
                alone.append(revealed(block, new, self.mask_id))
                return new
        rule_alone = Counted(**{f.name: getattr(rule, f.name) for f in dataclasses.fields(rule)})
        speculate.accept_temporal = counted
        try:
            for ids in prompts:
                simsd(target, None, ids, 64, rule, reference=reference, verifier="temporal", acceptance="paper")
                generate(target, ids, 64, rule_alone)
        finally:
            speculate.accept_temporal = accept
        print(f"B={B} {reference}: the rule alone {sum(alone) / len(alone):.2f} a step; " + "; ".join(
            f"{why}: {len(v)} rounds, {sum(v) / len(v):.2f}" for why, v in sorted(by.items())), flush=True)


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=80, help="the first N training-split problems")
    ap.add_argument("--block-size", default="4,32", help="comma-separated")
    ap.add_argument("--reference", default="lookup", choices=("lookup", "trajectory"))
    a = ap.parse_args()
    util.run(lambda: main(a.problems, util.int_list(a.block_size, "--block-size"), a.reference))
