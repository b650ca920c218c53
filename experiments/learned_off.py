"""What `--spec simsd` costs on open text with its drafter switched off: the speculative round
around the rule's step. Where its Learner keeps speculation off, a SimSD round still builds an
empty draft, its one copy, and the walk; a plain round only steps. This times the threshold rule
and SimSD with speculation never on (the same target forwards, no drafter forward: checked),
interleaved prompt by prompt, each first in turn, and prints the median over repeats of the
ratio of their tokens/s: what SimSD's learned rows on open text can reach at most.

    python experiments/learned_off.py --prompts 20 --max-new-tokens 128 --repeats 3
"""
import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sample  # noqa: E402
from measure.pricing import Learner  # noqa: E402
from training.tasks import speaker_prompts  # noqa: E402

SMOKE = "--prompts 2 --max-new-tokens 8 --repeats 1 --data none"
SMOKE_OUTPUT = r"SimSD, speculation never on: \d+\.\d+x the threshold rule's tokens/s"


class Never(Learner):
    def wants(self, spend=0.0):
        self.rounds += 1
        return False


def main(prompts, max_new_tokens, repeats, data):
    dec, tok = sample.load("simsd")
    off = replace(dec, pricing=replace(dec.pricing, alone=False, learn=lambda: Never(dec.pricing.cost, (1.0, 0.0))))
    plain = sample.load("none")[0]
    texts = ["ROMEO:"] * prompts if data == "none" else [t for t, _ in speaker_prompts(prompts, Path(data))]
    ids = [tok.encode(text) for text in texts]
    for p in ids:      # the same forwards, no drafter; and a first call's one-off costs paid
        a, b = plain(p, max_new_tokens), off(p, max_new_tokens)
        assert a[0] == b[0] and a[1]["nfe"] == b[1]["nfe"] and b[1]["nfe_draft"] == 0
    ratios = []
    for r in range(repeats):
        seconds = [0.0, 0.0]
        for k, p in enumerate(ids):
            for j in ((0, 1) if (k + r) % 2 else (1, 0)):
                t0 = time.perf_counter()
                (plain, off)[j](p, max_new_tokens)
                seconds[j] += time.perf_counter() - t0
        ratios.append(seconds[0] / seconds[1])
    print(f"SimSD, speculation never on: {statistics.median(ratios):.3f}x the threshold rule's tokens/s "
          f"({len(ids)} prompts, {max_new_tokens} new tokens, median of {repeats}: {[round(x, 3) for x in ratios]})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "data/val_text.jsonl"),
                    help="tools/prepare.py's held-out texts (none: \"ROMEO:\" each time)")
    a = ap.parse_args()
    main(a.prompts, a.max_new_tokens, a.repeats, a.data)
