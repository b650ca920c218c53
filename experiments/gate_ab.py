"""Does SimSD's drafter pay on this machine, and does the gate's price of a drafted round
(fast.gated: the cost table's drafter steps and round_s, plus its copies'
price) match what the round takes? (docs/results.md, "Copies bought at their price")

Held-out problems decoded by `threshold` and by `--spec simsd` with the drafter in every round
("always"), in none ("never": the rule alone, through SimSD's round), and as the cost table's
gate decides ("gated"), interleaved prompt by prompt; tokens/s x threshold per pass. Then, from
the always-pass's counts: a drafted round's measured time (after the prompts' prefills, priced
by the table) against the gate's price of it, and a rule round's against the table's; a drafter
step in decoding (between the target's forwards) against one timed back to back.

    python experiments/gate_ab.py --block-size 4 --passes 5
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import cli  # noqa: E402
import fast  # noqa: E402
import verify  # noqa: E402
from decode import Frontier, Session, generate  # noqa: E402
from loading import util  # noqa: E402
from measure import costs, reach  # noqa: E402
from measure.pricing import price  # noqa: E402
from speculate import Settings  # noqa: E402
from training.tasks import problems  # noqa: E402
from variants import simsd  # noqa: E402

SMOKE = "--prompts 2 --passes 1 --max-new-tokens 8"
SMOKE_OUTPUT = r"pass 1: always [\d.]+x, never [\d.]+x, gated [\d.]+x threshold\n.*drafted round [\d.]+ ms, priced [\d.]+.*\n.*in decoding, [\d.]+ ms timed back to back"


def main(block_size=4, prompts=40, passes=3, max_new_tokens=64, threads=2):
    util.check_positive(block_size=block_size, prompts=prompts, passes=passes, max_new_tokens=max_new_tokens)
    torch.set_num_threads(threads)
    tgt, tok, drf = cli.load_models(cli.DEFAULT_TARGET, cli.DEFAULT_DRAFTER, (block_size,))
    B, rule = block_size, cli.make_rule(tgt, block_size, cli.THRESHOLD)
    cost, how = costs.cost_model(cli.DEFAULT_TARGET, tgt, B)
    if cost is None or not cost.drafting:      # none for this machine: measured now, not saved
        print(f"{how}; measuring one now, with the drafter's prices", flush=True)
        table = costs.measure(tgt, B, 2)
        cost = costs.cost_of(dict(table, draft=costs.measure_draft(tgt, drf, B, 2, table=table)))
    cut = fast.cutter(cost, None, B, reach.find(cli.DEFAULT_TARGET, "simsd", rule)[0])
    insitu = {}                                               # drafter steps as they run, by ahead

    def timed(sess, front, rule, s, ahead, stops, generator=None):
        t0 = time.perf_counter()
        d = fast.draft_one_sync(sess, front, rule, s, ahead, stops, generator)
        insitu.setdefault(ahead, []).append((time.perf_counter() - t0) / min(s.draft_steps, front.n_masked + ahead * B))
        return d
    drafts = dict(always=timed, never=fast.gated(fast.draft_one_sync, cost, dict(step_s=[1.0]), (1.0, 0.0)),
                  gated=price("simsd", cli.DEFAULT_TARGET, tgt, rule, drf, table=cost).draft)
    runs = dict(threshold=lambda ids: generate(tgt, ids, max_new_tokens, rule), **{
        k: lambda ids, d=d: simsd(tgt, drf, ids, max_new_tokens, rule, draft=d, walk=verify.walk_one_sync, cut=cut)
        for k, d in drafts.items()})
    ids_all = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(prompts, "test")]
    for run in runs.values():                                         # warm-up
        run(ids_all[0])
    rounds = {}
    for i in range(passes):
        wall = dict.fromkeys(runs, 0.0)
        for ids in ids_all:
            for k, run in runs.items():
                t0 = time.perf_counter()
                _, st = run(ids)
                wall[k] += time.perf_counter() - t0
                if i == 0:   # rounds (after the prefill), steps walked, copies verified
                    r = rounds.setdefault(k, [0, 0, 0, 0.0])
                    r[0] += st["nfe"] - (len(ids) >= B)
                    r[1] += sum(n * x for n, x in st.get("steps_per_forward", {1: st["nfe"]}).items())
                    r[2] += sum(n * x for n, x in st.get("nodes_per_forward", {}).items())
                    r[3] += time.perf_counter() - t0 - cost(len(ids) // B)    # less the prefill
        print(f"pass {i + 1}: " + ", ".join(f"{k} {wall['threshold'] / wall[k]:.3f}x" for k in drafts) + " threshold",
              flush=True)
    (n_t, _, _, s_t), (n, steps, copies, s) = rounds["threshold"], rounds["always"]
    d, n = cost.drafting, max(n, 1)
    priced = min(d["draft_steps"], B) * d["step_s"][-1] + d.get("round_s", 0.0) + cost(1 + copies / n)
    print(f"a drafted round {1e3 * s / n:.2f} ms, priced {1e3 * priced:.2f} ms ({steps / n:.2f} steps, "
          f"{copies / n:.2f} copies); a rule round {1e3 * s_t / max(n_t, 1):.2f} ms, priced {1e3 * cost(1):.2f} ms")
    a = max(insitu)
    print(f"a drafter step ({a} blocks ahead): {1e3 * statistics.median(insitu[a]):.2f} ms in decoding, "
          f"{1e3 * back_to_back(drf, rule, ids_all[0], a):.2f} ms timed back to back")


def back_to_back(drafter, rule, prompt, ahead, calls=30):
    """The median drafter step of fast.draft_one_sync called again and again on one state, `ahead`
    blocks ahead: nothing between the calls."""
    B, s = rule.block_size, Settings().for_block(rule.block_size)
    n = len(prompt) // B * B
    sess = Session(drafter, B, n + (ahead + 2) * B)
    sess.prefill(torch.tensor(prompt[:n]))
    front = Frontier(torch.full((B,), rule.mask_id), torch.arange(n, n + B), B, [rule.mask_id] * B)
    times = []
    for _ in range(calls + 1):
        t0 = time.perf_counter()
        fast.draft_one_sync(sess, front, rule, s, ahead, set())
        times.append((time.perf_counter() - t0) / s.draft_steps)
    return statistics.median(times[1:])


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=40, help="held-out problems")
    ap.add_argument("--passes", type=int, default=3, help="timed passes over them")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    util.run(lambda: main(a.block_size, a.prompts, a.passes, a.max_new_tokens, a.threads))
