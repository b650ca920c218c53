"""Where decode time goes, per method (docs/history.md, "Where decode time goes, by part
(docs/results.md until 2026-12-07, AMD EPYC)"): each part's own time (exclusive: a part's
time excludes the parts it calls), summed over held-out problems, as shares of the decode
time; methods interleaved prompt by prompt, the first pass a warm-up, the shipped cost tables
(2 threads, as bench.py runs). Each part is timed by wrapping the function that does it, here
only: the decoders themselves time nothing.

  target forwards   decode.Session.forward on the target (prefill, rounds, commits)
  drafter forwards  the same on the drafter
  rule              DecodeRule.__call__: the decoding step (plain's, and the walk's)
  walk              verify.walk_one_sync around the rule: which copy each new state is, host copies
  hint              what the next round's guesses are read from (spiffy.ranks,
                    DecodeRule.best for the drafter-free references; inside the rule,
                    where a greedy step picks its tokens with it, the rule's)
  proposing         the guesses: the drafter's loop around its forwards (fast.draft_one_sync),
                    Spiffy's graph (draft_copies), trajectory / lookup, the drafted states
  loop, rest        everything else: the round loop, commits, stop checks, masks, positions

On a GPU every timed part syncs the device before it ends (else a part would own the
kernels the parts before it launched): the shares are of a synced run, slower than bench.py's.
The last column: a drafter forward's time against a verification (target) forward's in the
same method, and against threshold's own target forward.

    python experiments/round_costs.py                    # B = 4 and 8, 40 problems, eager
    python experiments/round_costs.py --prompts 20 --block-size 4,8,32 --compile
    python experiments/round_costs.py --compile drafter   # the drafter compiled, the target eager
    python experiments/round_costs.py --device cuda --dtype bfloat16 --compile   # gpu_check.sh's
    python experiments/round_costs.py --ops              # aten ops a token instead: exact, no clock
    python experiments/round_costs.py --prompts 1 --block-size 4 --max-new-tokens 8   # seconds

--ops counts the aten ops each part dispatches (a dispatch mode, eager only) instead of timing
it: counts repeat exactly, and on a CPU, where a small op costs its dispatch, the share of ops
outside the forwards is close to the share of time (docs/history.md, "Time outside the forwards
is its ops"). It prints a table per block size: a row per method, a column per part.
"""
import contextlib
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import graphs  # noqa: E402
import cli  # noqa: E402
from measure import costs  # noqa: E402
import decode  # noqa: E402
import fast  # noqa: E402
import verify  # noqa: E402
import speculate  # noqa: E402
import spiffy  # noqa: E402
import variants  # noqa: E402
from loading import util  # noqa: E402
from training.tasks import load_tasks  # noqa: E402

SMOKE = "--prompts 1 --block-size 4 --max-new-tokens 8"
SMOKE_OUTPUT = r"B = 4, 1 problems, eager: each part's share(.|\n)*\n--spec simsd +\d+\.\d%"
T, N, stack, where = defaultdict(float), defaultdict(int), [], [""]   # stack: [part, inner time]
OPS = defaultdict(int)                   # --ops: aten ops by (method, innermost part)
PARTS = ("target forwards", "drafter forwards", "rule", "walk", "hint", "proposing")


class CountOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        OPS[(where[0], stack[-1][0] if stack else "loop, rest")] += 1
        return func(*args, **(kwargs or {}))


def timed(owner, name, key, sync):
    """Wrap owner.name: its exclusive time goes to key (or key(args) -> key)."""
    f = getattr(owner, name)

    def wrapped(*a, **k):
        part = key(a) if callable(key) else key
        stack.append([part, 0.0])
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            sync()
            took, inner = time.perf_counter() - t0, stack.pop()[1]
            T[(where[0], part)] += took - inner
            N[(where[0], part)] += 1
            if stack:
                stack[-1][1] += took
    setattr(owner, name, wrapped)


def time_the_parts(target, sync):
    """Every part's function wrapped (for this process: the script ends after it)."""
    timed(decode.Session, "forward", lambda a: "target forwards" if a[0].model is target
          else "drafter forwards", sync)
    timed(decode.DecodeRule, "__call__", "rule", sync)
    timed(verify, "walk_one_sync", "walk", sync)
    timed(spiffy, "ranks", "hint", sync)
    timed(decode.DecodeRule, "best", lambda a: "rule" if stack and stack[-1][0] == "rule"
          else "hint", sync)
    for owner, name in ((fast, "draft_one_sync"), (spiffy, "draft_copies"), (variants, "trajectory"),
                        (variants, "lookup_draft"), (speculate, "drafted_states")):
        timed(owner, name, "proposing", sync)


def methods(target, drafter, B, n_new):
    """name -> run(prompt ids): each method as the command lines compose it."""
    rule = cli.make_rule(target, B, cli.THRESHOLD)
    cut = fast.cutter(costs.cost_model(cli.DEFAULT_TARGET, target, B, None)[0], None, B)
    kw, simsd = dict(cut=cut, walk=verify.walk_one_sync), dict(cut=cut, draft=fast.draft_one_sync, walk=verify.walk_one_sync)
    graph = graphs.load_graph(graphs.graph_path(cli.DEFAULT_TARGET, rule), rule)
    return {
        "threshold": lambda ids: decode.generate(target, ids, n_new, rule),
        "--spec simsd": lambda ids: variants.simsd(target, drafter, ids, n_new, rule, **simsd),
        "--spec spiffy": lambda ids: spiffy.spiffy_generate(target, ids, n_new, rule, graph, **kw),
        "trajectory": lambda ids: variants.simsd(target, None, ids, n_new, rule,
                                                 reference="trajectory", **simsd),
        "lookup": lambda ids: variants.simsd(target, None, ids, n_new, rule, reference="lookup",
                                             **simsd)}


def measure(runs, prompts, ops, sync):
    """Every method on every prompt, interleaved, twice (the first a warm-up) -> (seconds,
    tokens) by method; the parts' times (or ops) in T, N and OPS."""
    total, tokens = defaultdict(float), defaultdict(int)
    for warm in (True, False):
        T.clear(), N.clear(), OPS.clear()
        with CountOps() if ops and not warm else contextlib.nullcontext():
            for ids in prompts:
                for name, run in runs.items():
                    where[0] = name
                    sync()
                    t0 = time.perf_counter()
                    out, _ = run(ids)
                    sync()
                    total[name] += 0 if warm else time.perf_counter() - t0
                    tokens[name] += 0 if warm else len(out)
    return total, tokens


def print_ops(runs, tokens):
    print(f"{'':14s}" + "".join(f"{p:>17s}" for p in PARTS) + f"{'loop, rest':>12s}"
          f"{'outside forwards':>18s}{'ops a forward: target / drafter':>33s}")
    for name in runs:
        ops = {p: OPS[(name, p)] / tokens[name] for p in (*PARTS, "loop, rest")}
        inside = ops["target forwards"] + ops["drafter forwards"]
        a_call = [OPS[(name, p)] / N[(name, p)] for p in PARTS[:2] if N[(name, p)]]
        print(f"{name:14s}" + "".join(f"{ops[p]:17.1f}" for p in (*PARTS, "loop, rest")) +
              f"{1 - inside / sum(ops.values()):18.1%}"
              f"{' / '.join(f'{x:.0f}' for x in a_call):>33s}")


def print_times(runs, total, tokens):
    print(f"{'':14s}" + "".join(f"{p:>17s}" for p in PARTS) + f"{'loop, rest':>12s}"
          f"{'outside forwards':>18s}{'ms/token':>10s}{'drafter fwd x':>15s}")
    per = lambda name, p: T[(name, p)] / max(N[(name, p)], 1)   # noqa: E731  seconds a call
    for name in runs:
        share = {p: T[(name, p)] / total[name] for p in PARTS}
        rest = 1 - sum(share.values())
        outside = 1 - share["target forwards"] - share["drafter forwards"]
        print(f"{name:14s}" + "".join(f"{share[p]:17.1%}" for p in PARTS) + f"{rest:12.1%}"
              f"{outside:18.1%}{1e3 * total[name] / tokens[name]:10.3f}" + (
                  f"{per(name, 'drafter forwards') / per(name, 'target forwards'):8.2f} / "
                  f"{per(name, 'drafter forwards') / per('threshold', 'target forwards'):.2f}"
                  if N[(name, "drafter forwards")] else ""))


def main(prompts=40, block_sizes=(4, 8), device="cpu", dtype=None, compile=None, ops=False,
         max_new_tokens=64):
    util.check_positive(prompts=prompts, max_new_tokens=max_new_tokens)
    if ops and compile:
        raise ValueError("--ops counts eager ops; drop --compile")
    cli.check_device(device)
    torch.set_num_threads(2)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", block_sizes, device,
                                           getattr(torch, dtype) if dtype else None, compile)
    time_the_parts(target, sync)
    ids = [ids for ids, _ in load_tasks(None, prompts, tok, False)]
    how = ("the drafter compiled" if compile == "drafter" else "compiled" if compile
           else "eager")
    for B in block_sizes:
        runs = methods(target, drafter, B, max_new_tokens)
        total, tokens = measure(runs, ids, ops, sync)
        if ops:
            print(f"B = {B}, {prompts} problems, eager: aten ops a token, by part")
            print_ops(runs, tokens)
        else:
            print(f"B = {B}, {prompts} problems, {how}: each part's share of decode time (ms a "
                  f"token in all; a drafter forward x a target forward)")
            print_times(runs, total, tokens)


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=40, help="held-out problems")
    ap.add_argument("--block-size", default="4,8", help="comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=cli.DTYPES)
    ap.add_argument("--compile", nargs="?", const="auto", choices=cli.COMPILE_MODES)
    ap.add_argument("--ops", action="store_true", help="count aten ops a token by part, not time")
    a = ap.parse_args()
    util.run(lambda: main(a.prompts, util.int_list(a.block_size, "--block-size"), a.device,
                          a.dtype, a.compile, a.ops, a.max_new_tokens))
