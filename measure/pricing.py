"""The pricing seam: what the cost and reach tables decide for one speculative decoder.

price() decides how many copies a round verifies and how each is valued (`cut`), whether SimSD's
drafter runs in a round (`draft`), and whether the method runs as its rule alone (`alone`); for
the defaults, a request's Learner (`learn`) amends the first two by the request's own rounds.
Nothing else in decoding reads a table, and nothing here times anything: the same tables, the
same decisions. The tables: measure/costs.py (seconds a forward, by query rows; a drafter step;
a batch's share) and measure/reach.py (how often the walk visits each copy rank).
"""
from collections import Counter
from dataclasses import dataclass, fields, replace
from types import SimpleNamespace

import torch

import fast
import speculate
from measure import costs, reach
from measure.counts import Counts

GPU_ROWS = 256    # the row cap's default on a GPU (see max_rows)
MAX_BUCKET = 16   # static shapes: by default, queries of at most 16 blocks (fast.STATIC_ROWS rows)
LEARNED = ("simsd", "spiffy")   # the defaults: their rounds priced as a request decodes (Learner)
# a Learner's prior without a reach table (another rule or temperature): (steps, copies) a round, one a
# proposer at every B, not fit to the tables (greedy, SimSD's: 3.11 / 2.73 / 2.08 steps at B = 4 / 8 / 32)
STATED = {"simsd": (3.0, 4.0), "spiffy": (1.2, 2.0)}


@dataclass
class Pricing:
    """price()'s decisions, as the decoders take them."""
    cut: object = None        # Guesses -> the copies verified (fast.cutter; Spiffy's default: Learner.cut), None: all
    draft: object = fast.draft_one_sync   # SimSD's drafter loop (fast.gated: only in rounds that pay)
    alone: bool = False       # the method's rounds would pay in none: its rule runs alone
    note: str = ""            # the above in words, for the summary line
    why: str = ""             # its last part: the reach table used, or why the rule runs alone
    stale: str = None         # the cost table's warning when measured on other code
    max_rows: int = None      # the row cap the cut applies (None: no cap)
    cost: object = None       # the cost model (measure/costs.py; None: none)
    learn: object = None      # () -> a request's Learner (None: the tables decide alone)


def price(method, target_dir, target, rule, drafter=None, *, table=None, max_rows=None, device="cpu",
          compile=None, batch=1, lossless=True, learn=True, settings=None):
    """Pricing for `method` (measure/reach.METHODS: spiffy, simsd, simsd-lookup-temporal, ...; one
    ending in -temporal verifies on the paper's mask) on the model `target` (loaded from target_dir,
    where its tables lie) under `rule`, as one request of a batch of `batch` sees the price.
    table: --cost-table (None: the one beside the weights, "none", "flat", or a path), or a cost
    model (measure/costs.py's); lossless: False for the acceptance ablations, never gated; learn:
    False for the tables' decisions alone (else a request's own rounds amend them: Learner); settings:
    the method's flags (SimSD's drafter steps and lookahead price the round it drafts)."""
    cost, words = (costs.costs_in(table, batch), "a given cost model") if callable(table) else \
        costs.cost_model(target_dir, target, rule.block_size, table, batch)
    temporal = method.endswith("-temporal")
    per_round = reach.per_round(target_dir, method, rule) if cost is not None else None
    rows = default_rows(max_rows, device, compile, rule.block_size)
    p = Pricing(max_rows=rows, cost=cost, stale=getattr(cost, "stale", None))
    drafting = costs.drafting(cost, drafter, None if table == "flat" else target)   # (flat: drafting free)
    if per_round is not None and (temporal or lossless):
        # priced at the full round the decoder drafts, from a fresh block: a text's last rounds, fewer
        # blocks ahead, cost less and could pay (they are given up with the rest)
        flags = {"verifier": "temporal" if temporal else "copies", **(settings or {})}
        s = speculate.Settings(**{f.name: flags[f.name] for f in fields(speculate.Settings)
                                  if f.name in flags}).for_block(rule.block_size)
        fresh = SimpleNamespace(n_masked=rule.block_size, host=range(rule.block_size))
        spend = fast.spend(drafting, s, fresh, s.lookahead) if drafting else 0.0
        p.alone = not fast.pays(cost, per_round, spend)
    scale, reach_words = None, ""
    if not p.alone:   # (the rule alone cuts no copies, runs no drafter and learns nothing)
        if method in reach.METHODS and not temporal:   # (the temporal path cuts no copies)
            scale, reach_words = reach.find(target_dir, method, rule)
        p.cut = fast.cutter(cost, rows, rule.block_size, scale)
        if drafter is not None and (temporal or lossless):    # SimSD's drafter only where it pays
            p.draft = fast.gated(fast.draft_one_sync, cost, drafting, per_round)
        if learn and cost is not None and method in LEARNED and lossless and table != "flat":
            prior = per_round or STATED[method]   # the reach table's mean round, else a stated one
            p.learn = lambda: Learner(cost, prior, drafting, scale, fast.cutter(cost, rows, rule.block_size))
    if temporal:   # (the temporal path prices its drafting; it cuts no copies)
        words = words.replace("every copy verified", "every round drafts")
    words = ("priced by " if p.alone else "drafting priced by " if temporal else "copies sized by ") + words
    if drafting and "stated" in drafting:
        words += f"; drafting priced at {drafting['stated']:.2f}x a target forward (untimed: their active parameters)"
    if p.alone:
        shared = f" in a batch of {cost.batch}" if getattr(cost, "batch", 1) > 1 else ""
        reach_words = (f"B={rule.block_size} {method}: its rounds would not pay here{shared} ({per_round[0]:.2f} "
                       f"steps a round for {per_round[1]:.2f} copies, {speed(cost, per_round, spend):.2f}x the rule's "
                       f"steps a second, under the {fast.MARGIN:.2f}x it needs, by the cost and reach tables; "
                       "--cost-table none: unpriced): plain decoding, the rule alone")
    p.why = reach_words + ", amended by each request's own rounds" * bool(p.learn)
    p.note = words + (f"; at most {rows} rows a forward" if rows else "") + f"; {reach_words}" * bool(reach_words)
    return p


class Learner(Counts):
    """One request's speculation, switched off where its own rounds say it does not pay. A round
    that speculated (SimSD's drafted, Spiffy's verified copies) is worth its steps a second
    against the rule's one step a forward, by the cost table (`speed`); where the mean of the
    last WINDOW such rounds (the tables' mean round filling in those not yet seen) falls below
    OFF, speculation is off (SimSD's drafter does not run, Spiffy verifies the open block alone)
    for `wait` rounds, 2, 4, ... WAIT while it keeps failing; then one round speculates, a probe:
    worth at least OFF, it is on again; else off for twice as long. While on, a round speculates
    where its mean round (the tables', or the last probe's that paid) pays at its spend (the gate's
    question). Where the tables say no round pays, the rule runs alone, unlearned (probing there
    cost this CPU 5-16% of its speed: docs/results.md). Spiffy's copies are valued by its own
    reach scale per copy rank (`scale`). Counts only, never times: the same rounds, the same
    decisions. It lives for one request (Decoder makes one a call)."""
    WINDOW, OFF, WAIT, FADE, PRIOR = 4, 0.9, 64, 0.9, 1.0

    def __init__(self, cost, per_round, drafting=None, scale=None, sized=None):
        super().__init__()
        self.table_scale, self.raw = scale or [1.0], None   # the reach table's scale per copy rank (none: raw)
        self.sized = sized                              # Spiffy's copies cut and sized at a scale (fast.cutter)
        self.verified = Counter()                       # ("reach" | "walked", rank): this request's copies
        self.drafting = drafting or dict(step_s=[0.0])   # (a drafter not timed: drafting free)
        self.cost, self.est, self.rounds, self.wait, self.probe, self.speeds = cost, per_round, 0, 1, False, None
        self.on = False                                  # whether this round speculates
        self.back = 0                                    # the round speculation comes back (a probe)

    def wants(self, spend=0.0):
        """Whether this round speculates, at `spend` seconds of proposing (asked once a round)."""
        self.rounds, self.spend = self.rounds + 1, spend
        self.probe = self.rounds == self.back
        self.on = self.probe or self.rounds > self.back and fast.pays(self.cost, self.est, spend)
        return self.on

    def scale(self):
        """Per copy rank, the reach table's scale amended by the copies this request verified, as
        the table is made (measure/reach.py): (walked + PRIOR x the table's) / (raw reach + PRIOR),
        PRIOR one reach's worth (a request sees few rounds). What it saw fades by FADE a round that
        speculates, so a rank cut for a low scale is bought again. Past the last rank listed: the
        table's own last scale (the rank after it, never verified)."""
        at = lambda r: self.table_scale[min(r, len(self.table_scale)) - 1]   # noqa: E731
        return [(self.verified["walked", r] + self.PRIOR * at(r)) / (self.verified["reach", r] + self.PRIOR)
                for r in range(1, max([len(self.table_scale), *(r for _, r in self.verified)]) + 2)]

    def lossless(self, g, w):
        seen = super().lossless(g, w)
        if not self.on:   # (a round that proposed, its copies cut to the open block: judged too)
            return
        if self.raw is not None:   # Spiffy's: each verified copy's raw reach, and whether it was walked
            self.verified = Counter({k: self.FADE * x for k, x in self.verified.items()})
            for r, visited in enumerate(seen[1:], 1):
                self.verified["reach", r] += self.raw[r]
                self.verified["walked", r] += visited
        counts = (len(w.path), len(g.n_masked) - 1)
        x = speed(self.cost, counts, self.spend)
        last = self.speeds or [speed(self.cost, self.est, self.spend)] * self.WINDOW
        self.speeds = [x] * self.WINDOW if self.probe else last[1:] + [x]   # (a probe: its round alone)
        self.n["learned", "probes"] += self.probe
        if sum(self.speeds) >= self.OFF * self.WINDOW:
            if self.probe:
                self.est, self.n["learned", "back on"] = counts, self.n["learned", "back on"] + 1
            self.wait = self.wait if self.probe else 1
            return
        self.wait = min(self.WAIT, 2 * self.wait)    # off: the next `wait` rounds
        self.back = self.rounds + self.wait + 1
        self.n["learned", "switched off"] += 1

    def draft(self, sess, front, rule, s, ahead, stops, generator=None):
        """SimSD's drafter loop where this round speculates, at fast.gated's prices; a probe, the
        cheapest: one drafter step, the open block only."""
        if self.rounds + 1 == self.back:
            s, ahead = replace(s, draft_steps=1), 0
        spend = fast.spend(self.drafting, s, front, ahead)
        return fast.draft_one_sync(sess, front, rule, s, ahead, stops, generator) if self.wants(spend) \
            else speculate.Draft([], [], [], None, [])

    def cut(self, g):
        """Spiffy's cut: its copies sized at this request's reach scale (`scale`) where this round
        speculates, else the open block alone."""
        if not self.wants():
            return fast.prefix(g, 1)
        self.raw = g.reach
        g = fast.calibrated(g, self.scale())
        return self.sized(g) if self.sized else g

    def summary(self):
        return dict(super().summary(), learned=self.hist("learned"))


def speed(cost, per_round, spend):
    """A round's steps a second over the rule's (one step a forward of one block), by cost table
    `cost`: per_round (steps, copies past the open block), `spend` seconds of proposing."""
    return per_round[0] / (spend + cost(1 + per_round[1])) * cost(1)


def default_rows(rows, device, compile, block_size):
    """The most query rows of a verification's copies: --max-rows, else on a GPU or with static
    shapes the largest compiled bucket but the pending block's, at most GPU_ROWS (a copy past
    it costs compute, not only weight reads: an SDAR-8B forward in bf16 on an H200 is
    memory-bound up to about 200 rows); None (no cap) on a CPU."""
    if rows is not None or not (torch.device(device).type == "cuda" or compile == "static"):
        return rows
    return min(GPU_ROWS, (MAX_BUCKET - 1) * block_size)
