"""Spiffy: lossless auto-speculative decoding of a block-diffusion LM with calibrated draft graphs.

docs/design.md, section 4 (after the Spiffy paper). No drafter: the drafts are guesses of the
block's future states, built from the target's own last distribution.
  - A draft node is a set of extra reveals (i, j): "the position ranked i by top-1 confidence
    gets its j-th most likely token", all ranks read off the distribution the drafts are
    built from. Node A is a parent of B if B reveals one decoding step more and A's reveals
    are a subset of B's; a node can have several parents, so the drafts form a graph.
  - calibrate: run plain decoding on a few prompts, count the reveal sets that really
    followed each state, keep the connected subgraph of the D most frequent ones (JSON).
  - Each round: from the distribution of the last verified state, build the nodes of the
    graph on top of the current state, keep the D* best (geometric-mean score), run ONE
    forward over [current block ; node copies] (mask.block_copies: each copy sees the cache
    and itself, so each gets exactly the logits the target computes in that state), then
    walk: apply the decoding rule to the current logits; while the new state is a verified
    node, continue from that node's logits.
Every transition applies the plain decoding rule to the exact logits of the exact state, with
the random draws in the same order, so the output is plain decoding's, token for token.
(Exact in exact arithmetic, token for token in fp32; bf16 rounding: see verify.py.)

    python spiffy.py --calibrate            # models/target/spiffy_graph_b{4,8,32}_{static,t0.9}.json
    python spiffy.py --calibrate --strategy sequential --block-size 8   # another SDAR strategy
    python spiffy.py --calibrate --target ~/SDAR-8B-Chat --block-size 4 --threshold 0.9 \\
        --data gsm8k_calib.jsonl --chat --prompts 25   # a chat model, on prompts like its task
    python sample.py --spec spiffy
"""
import argparse
import json
import math
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

import util
from decode import (EB_THRESHOLD, STRATEGIES, DecodeRule, Session, check_prompt, decode, packed_index,
                    stop_ids, to_device)
from verify import forward_cost, verify_copies, walk

DRAFT_BUDGET = 8   # D*: the most draft-graph nodes verified a forward


def ranks(logits, states, rule, k=None, packed_at=None):
    """Rank the positions of each state by the confidence of their most likely token under
    `logits` (the distribution the drafts are built from; the rule's own confidence), masked
    positions first, and give each its k most likely tokens under the rule's `probs` (all if
    None: a full sort, for calibration; the drafts need only the graph's largest token rank).
    logits: (..., B, V) at every position of states (..., B), or packed (M, V) at the masked
    positions of `packed_at` (..., B), the states stepped from (a state's masked positions
    are among theirs). -> (..., B) positions by rank, (..., B, k) token order, (..., B, k)
    probs (a known position's are any row's). No host sync."""
    flat = logits.flatten(0, -2)
    at = torch.arange(states.numel(), device=states.device).view(states.shape) \
        if packed_at is None else packed_index(packed_at, rule.mask_id)    # (..., B): its row
    conf = rule.top_confidence(flat)[at].masked_fill(states != rule.mask_id, -1.0)
    order = conf.sort(dim=-1, descending=True, stable=True).indices
    p = rule.probs(flat)
    p, tok = p.sort(-1, descending=True) if k is None else p.topk(min(k, p.shape[-1]))
    by_rank = at.gather(-1, order)                                          # (..., B): rows by rank
    return order, tok[by_rank], p[by_rank]


def reveal_pairs(ranked, state, later, mask_id):
    """The (position rank, token rank) pairs that turn `state` into `later`, given the
    state's `ranks` (calibration only: it syncs freely)."""
    order, tok_order, _ = ranked
    m = int((state == mask_id).sum())
    return tuple((i, int((tok_order[i] == later[p]).nonzero()[0]))
                 for i, p in enumerate(order[:m].tolist()) if later[p] != mask_id)


def reachable(node, chosen, one_per_step):
    """A node can be matched only after one of its parents (a chosen node one step smaller),
    unless the first step can produce it: any reveal set under the threshold rule."""
    if len(node) == 1 or not one_per_step:
        return True
    return any(len(a) == len(node) - 1 and set(a) < set(node) for a in chosen)


def connected_top(nodes, score, budget, one_per_step):
    """The `budget` best nodes by score that stay connected to the root."""
    chosen, todo = [], sorted(nodes, key=lambda n: (-score[n], len(n), n))
    added = True
    while added and len(chosen) < budget:
        added = False
        for n in todo:
            if n not in chosen and reachable(n, chosen, one_per_step):
                chosen.append(n)
                added = True
                break
    return chosen


def one_per_step(rule):
    return rule.strategy in ONE_AT_A_TIME and rule.steps == rule.block_size


ONE_AT_A_TIME = ("low_confidence_static", "random", "sequential")   # quota-only strategies


def build_drafts(ranked, state, graph, budget, rule):
    """Instantiate the graph's nodes on `state` from its `ranks` (both as host lists: the round
    brought them back with its one host sync); keep the `budget` best by the geometric mean
    of their token probabilities and their children's scores (bottom-up).
    -> (block states (lists), one per kept node, best first; each one's chance: the product
    of its reveals' probabilities, what cost-sized copies weigh a copy by)."""
    order, tok_order, p = ranked
    m = state.count(rule.mask_id)                              # masked positions rank first
    # a token of probability 0 (cut by top-k / top-p) is never drawn: no copy for it
    nodes = [n for n in graph["nodes"] if all(i < m and j < len(p[i]) and p[i][j] > 0 for i, j in n)]
    single = one_per_step(rule)
    score = {}
    for n in sorted(nodes, key=len, reverse=True):             # children before parents
        logs = [math.log(max(p[i][j], 1e-30)) for i, j in n]
        logs += [math.log(score[c]) for c in nodes if set(n) < set(c)
                 and (len(c) == len(n) + 1 or not single)]
        score[n] = math.exp(sum(logs) / len(logs))
    drafts, chances = [], []
    for n in connected_top(nodes, score, budget, single):
        s = list(state)
        for i, j in n:
            s[order[i]] = tok_order[i][j]
        drafts.append(s)
        chances.append(math.prod(p[i][j] for i, j in n))
    return drafts, chances


def load_graph(path, rule):
    """Read a calibrated graph; refuse one made for another block size or decoding rule."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"draft graph {path} not found (run `{calibrate_command(path.parent, rule)}`, "
                                f"with --data FILE.jsonl [--chat] to calibrate on your own prompts)")
    try:
        g = json.loads(path.read_text())
        g["nodes"] = [tuple(tuple(p) for p in n) for n in g["nodes"]]
        for n in g["nodes"]:
            ranks_ok = all(type(x) is int and x >= 0 for p in n for x in p)
            if not n or not ranks_ok or any(len(p) != 2 for p in n) or len({i for i, _ in n}) < len(n):
                raise ValueError(f"node {list(n)} is not a set of [position rank, token rank] pairs")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"malformed draft graph {path}: {e}") from None
    want = graph_rule(rule)
    got = {k: g.get(k) for k in want}
    if got != want:
        raise ValueError(f"draft graph {path} was calibrated for {got}, not {want}")
    return g


def calibrate_command(target_dir, rule):
    """The spiffy.py command that writes the graph for `rule` next to target_dir's weights."""
    extra = {"low_confidence_static": "", "low_confidence_dynamic": f" --threshold {rule.threshold:g}",
             "entropy_bounded": f" --strategy entropy_bounded --eb-threshold {rule.eb_threshold:g}"}
    return (f"python spiffy.py --calibrate --target {target_dir} --block-size {rule.block_size}"
            + extra.get(rule.strategy, f" --strategy {rule.strategy}"))


def graph_path(target_dir, rule):
    """Where the graph calibrated for `rule` lives: next to the target's weights."""
    kind = {"low_confidence_static": "static", "low_confidence_dynamic": f"t{rule.threshold:g}",
            "entropy_bounded": f"eb{rule.eb_threshold:g}"}.get(rule.strategy, rule.strategy)
    return Path(target_dir) / f"spiffy_graph_b{rule.block_size}_{kind}.json"


def graph_rule(rule):
    r = dict(block_size=rule.block_size, strategy=rule.strategy, steps=rule.steps)
    if rule.strategy == "low_confidence_dynamic":
        r["threshold"] = rule.threshold
    if rule.strategy == "entropy_bounded":
        r["eb_threshold"] = rule.eb_threshold
    return r


def draft_copies(ranked, state, block, graph, budget, rule, cross, stops, cost=None):
    """A round's copies: the state, its drafts, and after each draft that finishes the block,
    the next block's first state (two copies of the budget for that draft), when `cross` (a
    block after this one is wanted) and the draft holds none of the `stops` ids (decoding
    would end there). cost(n copies) -> seconds a forward takes (verify.forward_cost): keep
    only the best drafts that maximise the expected steps per second (cost-sized copies).
    -> (copies, counts, parent, host states), as verify_copies takes them."""
    drafts, chances = build_drafts(ranked, state, graph, budget, rule) if graph else ([], [])
    host, parent, value = [state], [-1], 1.0
    best = (1.0 / cost(1) if cost else 1, 1)      # (expected steps per second, or copies; copies)
    for d, chance in zip(drafts, chances):
        crosses = cross and rule.mask_id not in d and not stops.intersection(d)
        if len(host) + crosses > budget:
            break
        host.append(d)
        parent.append(-1)
        if crosses:                    # its next block's first step comes with the forward too
            host.append([rule.mask_id] * rule.block_size)
            parent.append(len(host) - 2)
        value += chance * (1 + crosses)                       # expected steps a round
        best = max(best, (value / cost(len(host)) if cost else len(host), len(host)))
    host, parent = host[:best[1]], parent[:best[1]]
    copies = to_device(host, block.device) if len(host) > 1 else block[None]
    return copies, [s.count(rule.mask_id) for s in host], parent if max(parent) >= 0 else None, host


@torch.no_grad()
def spiffy_generate(model, prompt, max_new_tokens=64, rule=None, graph=None, draft_budget=DRAFT_BUDGET,
                    fuse_commit=True, eos_id=None, generator=None, on_block=None, record=None, cost_sized=True,
                    copy_commit=True):
    """Spiffy decoding; decode.generate's arguments and output, plus graph: a calibrated graph
    (load_graph; None: plain decoding); draft_budget: D*, the most copies a forward verifies
    besides the block's own state; cost_sized: only those that pay by this device's forward cost
    (draft_copies); record(states, logits): per block, its trajectory (calibrate). A finishing
    draft brings the next block's first state (blocks_ahead); copy_commit: see Session.keep."""
    c = model.config
    rule = rule or DecodeRule(c.mask_token_id, c.block_size)
    if draft_budget < 1:
        raise ValueError(f"draft budget D* must be >= 1, got {draft_budget}")
    ids = check_prompt(prompt, c, max_new_tokens, model.embed.weight.device)
    B, t0, stops = rule.block_size, time.perf_counter(), stop_ids(c, eos_id)
    sess = Session(model, B, len(ids) + max_new_tokens + (draft_budget + 4) * B, fuse_commit, copy_commit)
    advanced, verified, crossings = Counter(), Counter(), Counter()
    k = 1 + max((j for n in graph["nodes"] for _, j in n), default=0) if graph else 0
    cost = forward_cost(model, B) if graph and cost_sized else None
    copies_for = lambda ranked, state, block, room: draft_copies(ranked, state, block, graph, draft_budget,
                                                                 rule, room > 0, stops, cost)
    finished, started = [], []   # past a round's block: blocks finished, (block, state, step, ranks) begun

    def fill_block(block, pos, n_masked, room):
        if finished:                                             # finished by an earlier round
            return finished.pop(0)
        step, copies, counts, parent, states, trajectory = 0, block[None], [n_masked], None, [block], []
        if started:                                              # begun by an earlier round
            block, state, step, ranked = started.pop()
            copies, counts, parent, host = copies_for(ranked, state, block, room)
        while True:
            logits = verify_copies(sess, copies, pos, counts, rule.mask_id, parent)
            path, (state, *ranked), crossed = walk(logits, copies, counts, step, rule, generator, parent=parent,
                                                   extra=lambda lg, cp, st: ranks(lg, st, rule, k, cp) if graph else ())
            if record:                 # calibration only: keeps each step's logits, as (B, V)
                for lg, new in path:
                    trajectory.append(lg[packed_index(states[-1], rule.mask_id)])
                    states.append(new)
            step, block = step + len(path), path[-1][1]
            advanced[len(path)] += 1
            verified[len(copies) - 1] += 1
            if crossed:                                          # finished blocks: the first is this one
                crossings["blocks"] += len(crossed)
                sess.keep(*(j for _, j in crossed))
                finished.extend((copies[j], host[j]) for _, j in crossed)
                if rule.mask_id in state:
                    started.append((block, state, len(path) - crossed[-1][0], ranked))
                else:
                    finished.append((block, state))
                return finished.pop(0)
            if rule.mask_id not in state:
                if record:
                    record(states, trajectory)
                return block, state
            copies, counts, parent, host = copies_for(ranked, state, block, room)

    out, stop = decode(fill_block, [sess], ids, B, max_new_tokens, rule.mask_id, stops, on_block)
    seconds = time.perf_counter() - t0
    return out, dict(stop=stop, nfe=sess.nfe, rows=dict(sess.rows), tokens=len(out), seconds=seconds,
                     tokens_per_s=len(out) / seconds, steps_per_forward=dict(sorted(advanced.items())),
                     nodes_per_forward=dict(sorted(verified.items())), blocks_ahead=crossings["blocks"], lookahead=1)


def calibrate(model, prompts, rule, max_new_tokens=64, budget=16, max_depth=6):
    """Count the reveal sets that followed each state in plain decoding, relative to the
    distribution the drafts would have been built from (the previous state's), and keep
    the connected subgraph of the `budget` most frequent."""
    counts = Counter()

    def record(states, logits):
        # drafts for state t are built from logits[t - 1] (the previous state's forward)
        for t in range(1, len(states) - 1):
            ranked = ranks(logits[t - 1], states[t], rule)
            for d in range(1, min(max_depth, len(states) - 1 - t) + 1):
                counts[reveal_pairs(ranked, states[t], states[t + d], rule.mask_id)] += 1

    for p in prompts:
        spiffy_generate(model, p, max_new_tokens, rule, graph=None, record=record)
    nodes = connected_top(list(counts), counts, budget, one_per_step(rule))
    return dict(graph_rule(rule), nodes=nodes,
                counts=[counts[n] for n in nodes])


def graphs_for(target_dir, target, calib_prompts, note):
    """A graph per rule: the one shipped next to the target, else calibrated here on
    calib_prompts() (called once, when the first graph is missing)."""
    cache, prompts = {}, []

    def get(rule):
        key = (rule.block_size, rule.strategy)
        if key not in cache:
            path = graph_path(target_dir, rule)
            if path.is_file():
                cache[key] = load_graph(path, rule)
            else:
                t0 = time.perf_counter()
                prompts[:] = prompts or calib_prompts()
                cache[key] = calibrate(target, prompts, rule)
                note.append(f"calibrated a graph for {key} in {time.perf_counter() - t0:.1f} s "
                            f"({path.name} not found)")
        return cache[key]
    return get


def main(target="models/target", block_sizes=(4, 8, 32), threshold=None, prompts=50, budget=16,
         max_new_tokens=64, strategy=None, eb_threshold=EB_THRESHOLD, data=None, chat=False):
    """Calibrate and save a graph per (block size, rule) next to the target's weights: the
    static and threshold (0.9) rules, or the threshold rule at `threshold`, or one other of
    SDAR's strategies. Prompts: the first `prompts` training-split problems, or the first
    `prompts` of `data` (JSONL with "question"; in the checkpoint's chat template with
    `chat`), which should look like what the graph will decode. Every flag, the target,
    each block size and the data are checked before the first graph is written; each graph
    file is replaced whole."""
    from prepare import problems
    from cli import check_block_size, load, make_rule   # (the command line: cli imports this module)
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
    ap.add_argument("--calibrate", action="store_true", help="calibrate and save draft graphs")
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
    if not a.calibrate:
        ap.error("nothing to do: pass --calibrate")
    util.run(lambda: main(a.target, util.int_list(a.block_size, "--block-size"), a.threshold,
                          a.prompts, a.budget, strategy=a.strategy, eb_threshold=a.eb_threshold,
                          data=a.data, chat=a.chat))
