"""The pricing seam: what the cost and reach tables decide for one speculative decoder.

price() decides how many copies a round verifies and how each is valued (`cut`), whether SimSD's
drafter runs in a round (`draft`), and whether the method runs as its rule alone (`alone`).
Nothing else in decoding reads a table, and nothing here times anything: the same tables, the
same decisions. The tables: measure/costs.py (seconds a forward, by query rows; a drafter step;
a batch's share) and measure/reach.py (how often the walk visits each copy rank).
"""
from dataclasses import dataclass

import torch

import fast
import speculate
from measure import costs, reach

GPU_ROWS = 256    # the row cap's default on a GPU (see max_rows)
MAX_BUCKET = 16   # static shapes: by default, queries of at most 16 blocks (fast.STATIC_ROWS rows)


@dataclass
class Pricing:
    """price()'s decisions, as the decoders take them."""
    cut: object = None        # Guesses -> the copies verified (fast.cutter), None: every copy
    draft: object = speculate.draft_one_sync   # SimSD's drafter loop (fast.gated: only in rounds that pay)
    alone: bool = False       # the method's rounds would pay in none: its rule runs alone
    note: str = ""            # the above in words, for the summary line
    why: str = ""             # its last part: the reach table used, or why the rule runs alone
    stale: str = None         # the cost table's warning when measured on other code
    max_rows: int = None      # the row cap the cut applies (None: no cap)
    cost: object = None       # the cost model (measure/costs.py; None: none)


def price(method, target_dir, target, rule, drafter=None, *, table=None, max_rows=None, device="cpu",
          compile=None, batch=1, lossless=True):
    """Pricing for `method` (measure/reach.METHODS: spiffy, simsd, simsd-lookup-temporal, ...; one
    ending in -temporal verifies on the paper's mask) on the model `target` (loaded from target_dir,
    where its tables lie) under `rule`, as one request of a batch of `batch` sees the price.
    table: --cost-table (None: the one beside the weights, "none", "flat", or a path), or a cost
    model (measure/costs.py's); lossless: False for the acceptance ablations, never gated."""
    cost, words = (costs.costs_in(table, batch), "a given cost model") if callable(table) else \
        costs.cost_model(target_dir, target, rule.block_size, table, batch)
    temporal = method.endswith("-temporal")
    per_round = reach.per_round(target_dir, method, rule) if cost is not None else None
    rows = default_rows(max_rows, device, compile, rule.block_size)
    scale, reach_words = reach.find(target_dir, method, rule) if method in reach.METHODS and not temporal \
        else (None, "")                           # (the temporal path cuts no copies)
    p = Pricing(fast.cutter(cost, rows, rule.block_size, scale), max_rows=rows, cost=cost,
                stale=getattr(cost, "stale", None))
    drafting = costs.drafting(cost, drafter)
    if drafter is not None and (temporal or lossless):    # SimSD's drafter only where it pays
        p.draft = fast.gated(speculate.draft_one_sync, cost, drafting, per_round)
    if per_round is not None and (temporal or lossless):  # even proposing at its cheapest
        cheapest = min((drafting or dict(step_s=[0.0]))["step_s"]) + (drafting or {}).get("round_s", 0.0)
        p.alone = not fast.pays(cost, per_round, cheapest)
    if temporal:   # (the temporal path prices its drafting; it cuts no copies)
        words = "drafting priced by " + words.replace("every copy verified", "every round drafts")
    else:
        words = "copies sized by " + words
    if p.alone:
        shared = f" in a batch of {cost.batch}" if getattr(cost, "batch", 1) > 1 else ""
        reach_words = (f"B={rule.block_size} {method}: its rounds would not pay here{shared} ({per_round[0]:.2f} "
                       f"steps a round for {per_round[1]:.2f} copies, by the cost and reach tables): the rule alone")
    p.why = reach_words
    p.note = words + (f"; at most {rows} rows a forward" if rows else "") + f"; {reach_words}" * bool(reach_words)
    return p


def default_rows(rows, device, compile, block_size):
    """The most query rows of a verification's copies: --max-rows, else on a GPU or with static
    shapes the largest compiled bucket but the pending block's, at most GPU_ROWS (a copy past
    it costs compute, not only weight reads: an SDAR-8B forward in bf16 on an H200 is
    memory-bound up to about 200 rows); None (no cap) on a CPU."""
    if rows is not None or not (torch.device(device).type == "cuda" or compile == "static"):
        return rows
    return min(GPU_ROWS, (MAX_BUCKET - 1) * block_size)
