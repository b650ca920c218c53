"""Reach tables (measure/reach.py): each method decodes training-split problems with EVERY
copy verified (no cut), and the raw reach summed per copy rank is set against the rounds the
walk visited that copy; the scale per rank is written next to the target's weights, one file
per method, block size and rule, read by sample.py and bench.py's cut. Counts, not times: the
same tables on any machine, busy or not. Calibrate on problems the bench and tests do not run
(they run the test split).

    python tools/reach.py                    # models/target/reach_b{4,8,32}_{method}_t0.9.json
    python tools/reach.py --methods spiffy --block-size 32 --problems 100
    python tools/reach.py --temperature 0.8   # sampled: reach_b4_spiffy_t0.9_T0.8.json, ...
"""
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import json  # noqa: E402

import torch  # noqa: E402

import cli  # noqa: E402
import fast  # noqa: E402
import verify  # noqa: E402
from decode import generate  # noqa: E402
from loading import util  # noqa: E402
from measure import reach  # noqa: E402
from measure.counts import counting, reach_check  # noqa: E402
from measure.graphs import graph_path, load_graph  # noqa: E402
from spiffy import spiffy_generate  # noqa: E402
from training.tasks import problems  # noqa: E402
from variants import simsd  # noqa: E402

SMOKE = "--out {tmp} --block-size 4 --methods spiffy,simsd-trajectory,simsd-lookup-temporal --problems 2 --max-new-tokens 24"
SMOKE_OUTPUT = r"reach_b4_simsd-trajectory_t0\.9\.json: raw reach / walked, worst rank [\w.]+; #1: [\d.]+/\d+"


def decode_all(method, target, drafter, rule, prompts, max_new_tokens, graph=None):
    """Every prompt by `method` (Spiffy's: on `graph`; sampled: each decoding seeded alike), every
    copy verified (on the temporal mask: every draft) -> ({rank: raw reach summed}, {rank:
    walked}, {"rounds", "steps" walked, "copies" verified: summed}; a temporal round's steps: its
    tokens over the rule's own tokens a step, decoding the same prompts alone; its copies: drafts
    / block_size)."""
    reach_by, walked_by, rounds = {}, {}, dict(rounds=0, steps=0, copies=0)
    temporal, tokens, alone = method.endswith("-temporal"), 0, [0, 0]   # alone: (tokens, rounds)

    def seeded():   # each decoding's own generator, seeded alike (greedy: none)
        return torch.Generator(target.embed.weight.device).manual_seed(0) if rule.temperature else None
    for ids in prompts:
        if method == "spiffy":
            _, st = counting(spiffy_generate)(target, ids, max_new_tokens, rule, graph=graph, generator=seeded(),
                                              walk=verify.walk_one_sync)
        else:
            ref = method.removeprefix("simsd").removesuffix("-temporal").removeprefix("-") or "drafter"
            _, st = simsd(target, drafter if ref == "drafter" else None, ids, max_new_tokens, rule,
                          reference=ref, draft=fast.draft_one_sync, walk=verify.walk_one_sync, generator=seeded(),
                          **dict(verifier="temporal", acceptance="paper") if temporal else {})
        for r, x in st["reach_by_rank"].items():
            reach_by[r] = reach_by.get(r, 0.0) + x
        for r, x in st["walked_by_rank"].items():
            walked_by[r] = walked_by.get(r, 0) + x
        if temporal:
            n = sum(st["accept_hist"].values())
            rounds["rounds"] += n
            rounds["copies"] += st["drafts"] / rule.block_size
            tokens += st["tokens"]
            plain = generate(target, ids, max_new_tokens, rule, generator=seeded())[1]
            prefill = len(ids) >= rule.block_size      # (a forward only for a whole block)
            alone = [alone[0] + plain["tokens"], alone[1] + plain["nfe"] - prefill]
            continue
        rounds["rounds"] += sum(st["steps_per_forward"].values())
        rounds["steps"] += sum(n * x for n, x in st["steps_per_forward"].items())
        rounds["copies"] += sum(n * x for n, x in st["nodes_per_forward"].items())
    if temporal:
        rounds["steps"] = tokens * alone[1] / max(alone[0], 1)
    return reach_by, walked_by, rounds


def shown(path):
    """path from the repository root where it is inside it (no machine's own folders)."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(target=cli.DEFAULT_TARGET, drafter=cli.DEFAULT_DRAFTER, block_sizes=(4, 8, 32),
         methods=("spiffy", "simsd", "simsd-trajectory"), threshold=cli.THRESHOLD, n_problems=160,
         max_new_tokens=64, out=None, temperature=0.0):
    """A reach table per (method, block size) on the threshold rule at `threshold`, from the
    first n_problems training-split problems, sampled at `temperature` (0: greedy); every flag
    checked before the first table."""
    util.check_positive(problems=n_problems, max_new_tokens=max_new_tokens, block_size=min(block_sizes))
    if set(methods) - set(reach.METHODS):
        raise ValueError(f"unknown --methods {','.join(methods)}; choose from {', '.join(reach.METHODS)}")
    cli.check_rule(threshold, temperature, None, cli.EB_THRESHOLD)
    out = Path(out or target)
    util.check_writable(out, "--out", folder=True)
    out.mkdir(parents=True, exist_ok=True)
    drafted = {"simsd", "simsd-temporal"} & set(methods)
    tgt, tok, drf = cli.load_models(target, drafter if drafted else None, block_sizes)
    prompts = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(n_problems, "train")]
    for B in block_sizes:
        rule = cli.make_rule(tgt, B, threshold, temperature)
        for m in methods:
            graph = load_graph(graph_path(target, rule), rule) if m == "spiffy" else None
            reach_by, walked_by, rounds = decode_all(m, tgt, drf, rule, prompts, max_new_tokens, graph)
            ranks = range(1, max([*reach_by, 0]) + 1)
            t = reach.table(m, rule, [reach_by.get(r, 0.0) for r in ranks], [walked_by.get(r, 0) for r in ranks],
                            **rounds, problems=f"train 0..{n_problems - 1}", max_new_tokens=max_new_tokens,
                            date=date.today().isoformat(), target=shown(target))
            path = reach.table_path(out, m, rule)
            with util.atomic_write(path) as tmp:
                tmp.write_text(json.dumps(t) + "\n")
            print(f"{path}: raw reach / walked, worst rank {reach_check(reach_by, walked_by)[0]:.2f}; "
                  + "  ".join(f"#{r}: {reach_by[r]:.1f}/{walked_by.get(r, 0)}" for r in list(ranks)[:8]), flush=True)


def parse_args(argv=None):
    ap = util.ArgumentParser(description=__doc__, formatter_class=util.argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(cli.DEFAULT_TARGET), help="checkpoint directory")
    ap.add_argument("--drafter", default=str(cli.DEFAULT_DRAFTER), help="SimSD's drafter (method simsd)")
    ap.add_argument("--block-size", default="4,8,32", help="comma-separated")
    ap.add_argument("--methods", default="spiffy,simsd,simsd-trajectory",
                    help=f"comma-separated: {', '.join(reach.METHODS)}")
    ap.add_argument("--threshold", type=float, default=cli.THRESHOLD, help="the threshold rule's")
    ap.add_argument("--problems", type=int, default=160, help="the first N training-split problems")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampled at it (0: greedy), each decoding seeded alike")
    ap.add_argument("--out", default=None, help="the folder to write to (default: --target)")
    a = vars(ap.parse_args(argv))
    return dict(target=a["target"], drafter=a["drafter"], threshold=a["threshold"],
                block_sizes=util.int_list(a["block_size"], "--block-size"), out=a["out"],
                methods=tuple(a["methods"].split(",")), n_problems=a["problems"],
                max_new_tokens=a["max_new_tokens"], temperature=a["temperature"])


if __name__ == "__main__":
    util.run(lambda: main(**parse_args()))
