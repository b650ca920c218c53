"""Spiffy: lossless auto-speculative decoding of a block-diffusion LM with calibrated draft graphs.

docs/design.md, section 4 (after the Spiffy paper). No drafter: the drafts are guesses of the
block's future states, built from the target's own last distribution.
  - A draft node is a set of reveals (i, j): "the position ranked i by confidence gets its
    j-th most likely token" (ranks). Node A is a parent of B if A's reveals are a strict subset
    of B's (exactly one fewer under a one-token-a-step rule). The graph: the D reveal sets seen
    most often 1 to 6 steps after a state in plain decoding, under a one-token rule only those
    connected to the root (calibrate; tools/calibrate.py writes them next to the weights).
  - A round: the graph's nodes on the current state, from the last forward's ranks, the D* best
    (build_drafts), and after a draft that finishes the block the next block's first state, all
    verified in ONE forward of block copies and walked (verify.py): plain decoding's tokens.

    python sample.py --spec spiffy
"""
import math
from collections import Counter

import torch
from decode import DecodeRule, Session, check_prompt, packed_index, round_loop, stop_ids, to_device
from verify import Guesses, lossless_round, walk

DRAFT_BUDGET = 8   # D*: the most draft-graph nodes verified a forward


def ranks(logits, states, rule, k=None, packed_at=None):
    """Rank the positions of each state by the rule's confidence in their most likely token
    under `logits`, masked positions first, and give each its k most likely tokens and their
    `probs` (k None: all, for calibration). logits: (..., B, V) at every position of states
    (..., B), or packed at the masked positions of `packed_at`, the states stepped from.
    -> (..., B) positions by rank, (..., B, k) token order, (..., B, k) probs. No host sync."""
    flat = logits.flatten(0, -2)
    at = torch.arange(states.numel(), device=states.device).view(states.shape) \
        if packed_at is None else packed_index(packed_at, rule.mask_id)    # (..., B): its row
    conf = rule.best(flat)[1][at].masked_fill(states != rule.mask_id, -1.0)
    order = conf.sort(dim=-1, descending=True, stable=True).indices
    p = rule.probs(flat)
    p, tok = p.sort(-1, descending=True) if k is None else p.topk(min(k, p.shape[-1]))
    by_rank = at.gather(-1, order)                                          # (..., B): rows by rank
    return order, tok[by_rank], p[by_rank]


def reachable(node, chosen, stepwise):
    """A node can be matched only after one of its parents (a chosen node one step smaller),
    unless the first step can produce it (stepwise: the rule reveals one token a step; under
    the threshold rule any reveal set can come first)."""
    return len(node) == 1 or not stepwise or \
        any(len(a) == len(node) - 1 and set(a) < set(node) for a in chosen)


def connected_top(nodes, score, budget, stepwise):
    """The `budget` best nodes by score that are `reachable` (stepwise: connected to the root)."""
    chosen, todo = [], sorted(nodes, key=lambda n: (-score[n], len(n), n))
    while len(chosen) < budget:
        n = next((n for n in todo if n not in chosen and reachable(n, chosen, stepwise)), None)
        if n is None:
            return chosen
        chosen.append(n)
    return chosen


def one_per_step(rule):   # the rule reveals one token a step: a node can only follow its parent
    return rule.strategy in ("low_confidence_static", "random", "sequential") and \
        rule.steps == rule.block_size


def build_drafts(ranked, state, graph, budget, rule):
    """Instantiate the graph's nodes on `state` from its `ranks` (host lists); keep the
    `budget` best by the geometric mean of their token probabilities and their children's
    scores (bottom-up). -> (block states, best first; each one's reach: the product of its
    reveals' probabilities)."""
    order, tok_order, p = ranked
    m = state.count(rule.mask_id)                              # masked positions rank first
    # a token of probability 0 (cut by top-k / top-p) is never drawn: no copy for it
    drawable = lambda i, j: i < m and j < len(p[i]) and p[i][j] > 0    # noqa: E731
    nodes = [n for n in graph["nodes"] if all(drawable(i, j) for i, j in n)]
    single, score = one_per_step(rule), {}
    for n in sorted(nodes, key=len, reverse=True):             # children before parents
        logs = [math.log(max(p[i][j], 1e-30)) for i, j in n]
        logs += [math.log(score[c]) for c in nodes if set(n) < set(c)
                 and (len(c) == len(n) + 1 or not single)]
        score[n] = math.exp(sum(logs) / len(logs))
    kept = [(n, {order[i]: tok_order[i][j] for i, j in n})        # node, its reveals
            for n in connected_top(nodes, score, budget, single)]
    return [[r.get(q, t) for q, t in enumerate(state)] for _, r in kept], \
        [math.prod(p[i][j] for i, j in n) for n, _ in kept]


def draft_copies(ranked, state, block, graph, budget, rule, cross, stops):
    """A round's copies: the open block's state and its drafts (build_drafts), and after each
    draft that finishes the block, the next block's first state (two copies of the budget for
    that draft), when `cross` (a block after this one is wanted) and the draft holds none of
    the `stops` ids (decoding would end there). `budget` (D*) counts the copies past the open
    block's own: at most 1 + D* in all. -> verify.Guesses."""
    drafts, odds = build_drafts(ranked, state, graph, budget, rule) if graph and ranked else \
        ([], [])   # (no ranks for a new block's first state: no forward has seen it)
    host, after, reach = [state], [-1], [1.0]
    for d, p in zip(drafts, odds):
        crosses = cross and rule.mask_id not in d and not stops.intersection(d)
        if len(host) + crosses > budget:
            break
        host, after, reach = host + [d], after + [-1], reach + [p]
        if crosses:                    # its next block's first step comes with the forward too
            host, after = host + [[rule.mask_id] * rule.block_size], after + [len(host) - 1]
            reach.append(p)
    copies = to_device(host, block.device) if len(host) > 1 else block[None]
    counts = [s.count(rule.mask_id) for s in host]
    return Guesses(copies, counts, after if max(after) >= 0 else None, reach)


@torch.no_grad()
def spiffy_generate(model, prompt, max_new_tokens=64, rule=None, graph=None,
                    draft_budget=DRAFT_BUDGET, fuse_commit=True, eos_id=None, generator=None,
                    on_block=None, counts=None, walk=walk, cut=None):
    """Spiffy decoding; decode.generate's arguments and output, plus graph: a calibrated graph
    (measure.graphs.load_graph; None: plain decoding); draft_budget: D*, the most copies a forward
    verifies besides the open block's own state; counts: a counts.Counts each round reports
    to. The speed devices (fast.py): walk, and cut(guesses) -> the copies verified (None: all)."""
    c = model.config
    rule = rule or DecodeRule(c.mask_token_id, c.block_size)
    if draft_budget < 1:
        raise ValueError(f"draft budget D* must be >= 1, got {draft_budget}")
    ids, B, stops = check_prompt(prompt, c, max_new_tokens), rule.block_size, stop_ids(c, eos_id)
    sess = Session(model, B, len(ids) + max_new_tokens + (draft_budget + 4) * B, fuse_commit)
    k = 1 + max((j for n in graph["nodes"] for _, j in n), default=0) if graph else 0  # ranks'

    def propose(front, left):   # the graph's drafts, from the ranks the last forward gave
        g = draft_copies(front.ranks, front.host, front.block, graph, draft_budget, rule,
                         left > 0, stops)
        return cut(g) if cut else g

    def extra(logits, stepped_from, new):   # the walk's: each new state, ranked by its step's
        return ranks(logits, new, rule, k, packed_at=stepped_from) if graph else ()   # logits
    one_round = lossless_round(sess, rule, propose, generator, extra, walk, counts)
    out, run = round_loop(one_round, [sess], ids, rule, max_new_tokens, stops, on_block)
    return out, dict(run, tokens_per_s=len(out) / run["seconds"], lookahead=1)


# Calibration: the offline step making a graph (tools/calibrate.py writes them next to the weights)

@torch.no_grad()
def trajectories(model, prompt, max_new_tokens, rule, record):
    """Plain decoding of `prompt`, calling record(states, logits) as each block ends: its
    states, and the (B, V) logits each step read (the walk's extra sees every step)."""
    ids, B = check_prompt(prompt, model.config, max_new_tokens), rule.block_size
    sess, states, logits = Session(model, B, len(ids) + max_new_tokens + 3 * B), [], []

    def step(lg, copies, new):
        states[:] = states or [copies[0]]
        logits.append(lg[packed_index(copies[0], rule.mask_id)])
        states.append(new[0])
        if rule.mask_id not in new[0]:
            record(list(states), list(logits))
            states.clear(), logits.clear()
        return ()
    plain = lambda front, left: Guesses(front.block[None], [front.n_masked])   # noqa: E731
    one_round = lossless_round(sess, rule, plain, extra=step)
    round_loop(one_round, [sess], ids, rule, max_new_tokens, stop_ids(model.config))


def calibrate(model, prompts, rule, max_new_tokens=64, budget=16, max_depth=6):
    """Count the reveal sets that turned each state into each of the next 1 to `max_depth` in
    plain decoding, relative to the distribution the drafts would have been built from (the
    previous state's), and keep the `budget` most frequent (connected_top)."""
    counts = Counter()

    def record(states, logits):
        # drafts for state t are built from logits[t - 1] (the previous state's forward)
        for t in range(1, len(states) - 1):
            ranked = ranks(logits[t - 1], states[t], rule)
            for d in range(1, min(max_depth, len(states) - 1 - t) + 1):
                counts[reveal_pairs(ranked, states[t], states[t + d], rule.mask_id)] += 1

    for p in prompts:
        trajectories(model, p, max_new_tokens, rule, record)
    nodes = connected_top(list(counts), counts, budget, one_per_step(rule))
    return dict(graph_rule(rule), nodes=nodes, counts=[counts[n] for n in nodes])


def reveal_pairs(ranked, state, later, mask_id):
    """The (position rank, token rank) pairs that turn `state` into `later`, given the
    state's `ranks` (calibration only: it syncs freely)."""
    order, tok_order, _ = ranked
    m = int((state == mask_id).sum())
    return tuple((i, int((tok_order[i] == later[p]).nonzero()[0]))
                 for i, p in enumerate(order[:m].tolist()) if later[p] != mask_id)


def graph_rule(rule):
    r = dict(block_size=rule.block_size, strategy=rule.strategy, steps=rule.steps)
    if rule.strategy == "low_confidence_dynamic":
        r["threshold"] = rule.threshold
    if rule.strategy == "entropy_bounded":
        r["eb_threshold"] = rule.eb_threshold
    return r
