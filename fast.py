"""Speed devices, set apart from the reference: no core decoder (decode, verify, speculate,
spiffy) imports this module. The command lines compose them; each gives the core's tokens and
forwards (tests/test_fast.py). (The one-sync walk is the core's own twin, beside its
reference: verify.walk_one_sync.)

- draft_one_sync: SimSD's drafter loop (speculate.draft) with one host sync a round.
- pays, gated: whether a round is expected to pay (the cost and reach tables); SimSD's drafter
  run only in rounds that do, decided before it runs (its forwards and ops cost too).
- cutter: the copies a round verifies, cut to a row cap (a GPU's static buckets) and sized by
  a cost table (costs.py): the prefix with the most expected steps a second, each copy's
  reach calibrated by a reach table (measure/reach.py).
- compile_static: torch.compile with static shapes (CUDA graphs on CUDA): the queries padded
  to a power of two of rows, so each length compiles once.
- compile_dynamic: torch.compile with dynamic shapes (the CPU's --compile): a graph a mask kind.
"""
from itertools import accumulate

import torch
import torch.nn.functional as F

from decode import to_device, to_host
from speculate import Draft
from verify import Guesses

STATIC_ROWS = 512   # static shapes: the most query rows a forward (a larger one is an error)
MARGIN = 1.1   # the least gain a speculative round must promise: a table's prices relative to
               # each other moved 4-13% between runs of tools/costs.py on a 2-core CPU (once 37%)


def pays(cost, per_round, spend=0.0):
    """Whether a speculative round is expected to give MARGIN times the steps a second of the
    rule alone: per_round = (steps it walks, copies past the open block it verifies), for
    `spend` seconds of proposing and a forward of 1 + copies (cost: a cost table's); the rule
    alone walks 1 step for a forward of 1. Nothing is timed: the same tables, the same decisions."""
    steps, copies = per_round
    return steps / (spend + cost(1 + copies)) > MARGIN / cost(1)


def gated(draft, cost, drafting, per_round):
    """SimSD's drafter loop `draft`, run only in rounds where it pays, decided before it runs. By
    a cost table's prices (measure/costs.py), a drafted round costs:
        k * drafting["step_s"][ahead]   k drafter steps (forwards AND ops, catching up included)
      + drafting["round_s"]             what a drafted round takes beyond that and its copies
      + cost(1 + copies)                its forward and walk (in pays)
    and walks per_round[0] steps (a reach table's means a round: per_round). A round that does
    not pay proposes nothing: an empty Draft, whose one copy (the open block) is walked one
    step, the rule's own (on the temporal mask: speculate.accept_temporal's own step); the
    drafter's cache catches up when it next runs. Without drafting or per_round: `draft`."""
    if not drafting or not per_round:
        return draft

    def gated_draft(sess, front, rule, s, ahead, stops, generator=None):
        return draft(sess, front, rule, s, ahead, stops, generator) if pays(
            cost, per_round, spend(drafting, s, front, ahead)) else Draft([], [], [], None, [])
    return gated_draft


def spend(drafting, s, front, ahead):
    """A drafted round's seconds of proposing by a cost table's `drafting` prices (see gated)."""
    k, step_s = min(s.draft_steps, front.n_masked + ahead * len(front.host)), drafting["step_s"]
    return k * step_s[min(ahead, len(step_s) - 1)] + drafting.get("round_s", 0.0)   # as draft runs


def prefix(g, n):
    """The first n copies of Guesses g (a copy comes after the copy it follows: still a whole)."""
    cut = lambda x: x if x is None else x[:n]   # noqa: E731
    return Guesses(g.copies[:n], g.n_masked[:n], cut(g.after), cut(g.reach), cut(g.drafted))


def sized(g, cost):
    """The prefix of Guesses g with the most expected steps a second: copy i is worth
    g.reach[i] steps (the proposer's guess that the walk reaches it; the open block's own
    state 1), and a forward of n copies takes cost(n) seconds (a cost table, costs.py)."""
    if g.reach is None:
        return g
    value, best = 0.0, (0.0, 1)
    for n, reach in enumerate(g.reach, 1):
        value += reach
        best = max(best, (value / cost(n), n))
    return prefix(g, best[1])


def calibrated(g, scale):
    """Guesses g with copy rank r's reach min(1, scale[r - 1] * raw reach), the last scale past
    the table (measure/reach.py): what the walk is seen to visit, not what the proposer hopes."""
    if g.reach is None or not scale:
        return g
    at = lambda r: scale[min(r, len(scale)) - 1]   # noqa: E731
    reach = g.reach[:1] + [min(1.0, at(r) * x) for r, x in enumerate(g.reach[1:], 1)]
    return Guesses(g.copies, g.n_masked, g.after, reach, g.drafted)


def cutter(cost=None, max_rows=None, block_size=None, scale=None):
    """The decoders' `cut`: a round's copies cut to those max_rows query rows hold (None: no
    cap), their reach calibrated by `scale` (a reach table's; None: raw), then sized by the
    cost table `cost` (None: not sized); None when none of them."""
    if max_rows is not None and max_rows < block_size:
        raise ValueError(f"--max-rows {max_rows} is below one block ({block_size} rows)")
    cap = None if max_rows is None else max_rows // block_size
    if cost is None and cap is None and not scale:
        return None

    def cut(g):
        g = calibrated(prefix(g, cap), scale)
        return sized(g, cost) if cost else g
    return cut


def draft_one_sync(sess, front, rule, s, ahead, stops, generator=None):
    """draft's Draft with ONE host sync a round: the command lines' drafter loop. It differs in how:
    every decision stays on the device, so it runs min(steps, masks in the window) forwards, those
    past the drafter's stop revealing nothing. Held equal to draft: tests/test_fast.py."""
    B, mask_id, W = rule.block_size, rule.mask_id, (1 + ahead) * rule.block_size
    steps, threshold, stop, gamma = s.draft_steps, s.draft_threshold, s.draft_stop, s.gamma
    window = torch.cat([front.block, front.block.new_full((ahead * B,), mask_id)])
    pos = front.pos[0] + torch.arange(W, device=window.device)
    block_of = torch.arange(W, device=window.device) // B
    tau, key = torch.zeros_like(window), torch.zeros_like(window)    # step label, draft order
    p_at, alive, more = None, torch.ones((), dtype=torch.bool, device=window.device), []
    ends = to_device(sorted(stops), window.device)
    for t in range(1, min(steps, front.n_masked + ahead * B) + 1):
        logits = sess.forward(window, pos, keep=W)
        masked = window == mask_id
        active = masked.view(-1, B).any(-1).int().argmax()     # the first block with a mask
        alive &= ~(torch.isin(window, ends) & (block_of < active)).any()
        can = masked & (block_of == active) & alive
        conf = rule.best(logits)[1].masked_fill(~can, -1.0)
        rank = conf.sort(descending=True, stable=True).indices.argsort()  # each position's
        n = (conf.double() > threshold).sum().clamp(min=1) if threshold else torch.ones_like(active)
        reveal = can & (rank < torch.minimum(n, gamma - (tau > 0).sum()))
        p, tok = rule.probs(logits), rule.pick(logits, generator)[0]
        window, left = torch.where(reveal, tok, window), conf.masked_fill(reveal, -1.0)
        best = left.argmax(0, keepdim=True)   # the surest position the step left masked, its token
        more.append(torch.cat([torch.where(reveal.any() & (left[best] >= 0), best, -1), tok[best]]))
        tau, key = torch.where(reveal, t, tau), torch.where(reveal, t * W + rank, key)
        p_at = p if p_at is None else torch.where(reveal[:, None], p, p_at)
        if stop:                                   # the best confidence left, below `stop`
            best_left = left.amax()
            alive &= (best_left < 0) | (best_left.double() >= stop)   # (as the loop compares)
    reach = p_at.gather(-1, window[:, None]).squeeze(-1)
    tokens, tau, key, reach, more = to_host(window, tau, key, reach, torch.stack(more))  # one sync
    at = sorted((i for i in range(W) if tau[i]), key=key.__getitem__)
    reach = list(accumulate((reach[i] for i in at), lambda a, b: a * b))   # p_draft's product
    return Draft(at, [tokens[i] for i in at], [tau[i] for i in at],
                 p_at[to_device(at, window.device)], reach,
                 {t: tuple(x) for t, x in enumerate(more, 1) if x[0] >= 0})


def compile_static(model, **options):
    """Compile `model`'s cached forwards with static shapes: each forward's queries padded to
    a power of two of rows, the keys the whole cache, the cache row a device tensor, so each
    length compiles once; with mode="reduce-overhead" on CUDA each is replayed as a CUDA
    graph. The mask (a BlockMask on CUDA) is built inside; fast.padded tables how the queries
    see each other, so one graph a length serves every mask kind. The prompt's prefill (any
    length, once a prompt) runs eager; the head runs eager on the rows asked for, so their
    number makes no new graph."""
    static_shapes(model, many_graphs(torch.compile(type(model).trunk, dynamic=False, **options)))


def static_shapes(model, trunk):
    """model's cached forwards through `trunk` (Transformer.trunk's signature, the model first)
    with static shapes (compile_static; tests run it uncompiled)."""
    eager, setup = type(model).forward, model.setup_cache

    def forward(idx, pos, start=None, mask=None, keep=None, rows=None):
        T = idx.shape[1]
        if not start:
            return eager(model, idx, pos, start, mask, keep, rows)
        n = 1 << (T - 1).bit_length()
        if n > STATIC_ROWS:
            raise RuntimeError(f"{T} query rows: more than the largest compiled bucket "
                               f"({STATIC_ROWS}); cap the rows a forward (max_rows)")
        start_t, n_real = to_device(start, idx.device), to_device(T, idx.device)
        x = trunk(model, F.pad(idx, (0, n - T)), F.pad(pos, (0, n - T)), start_t,
                  padded(mask, start_t, n_real, n))[:, T - keep:T]
        return model.head(x if rows is None else x[:, rows])
    model.forward = forward   # (an instance attribute: nn.Module's call finds it first)
    model.setup_cache = lambda max_len, batch=1: setup(max_len + STATIC_ROWS, batch)  # + padding


def padded(mask_mod, prefix, n_real, n_pad):
    """Static shapes (compile_static): the queries padded from `n_real` rows to `n_pad`,
    the keys the whole cache. Every rule above lets each query see the whole committed cache
    (keys < prefix); how the queries see each other is evaluated here, once, into an
    (n_pad, n_pad) table, so that one closure, and one compiled graph a query length, serves
    every rule. A padding query sees the cache and itself (no row is empty); no real query
    sees a padding one."""
    q = torch.arange(n_pad, device=prefix.device)[:, None]
    k = q.T
    inside = (mask_mod(0, 0, q, prefix + k) & (k < n_real)) | ((q >= n_real) & (q == k))
    # one lookup, no `&` or `|` on it (inductor's CPU code for create_block_mask fails on
    # those, torch 2.13: docs/torch_bugs/flex_cpu_vecmask_mix.py): column 0 is the cache
    # (seen), 1 + k query k, the last past them all
    table = torch.cat([inside.new_ones(n_pad, 1), inside, inside.new_zeros(n_pad, 1)], 1)

    def padded_mask(b, h, q_idx, kv_idx):             # clamp: flex pads indices past the end
        return table[q_idx.clamp(0, n_pad - 1), (kv_idx - prefix).clamp(-1, n_pad) + 1]
    return padded_mask


def compile_dynamic(model, **options):
    """Compile the trunk once for dynamic shapes (the CPU's --compile): a graph a mask kind
    (block-causal, copies, temporal) and model, not a length. The head runs eager, as with
    static shapes."""
    compiled = many_graphs(torch.compile(model.trunk, dynamic=True, **options))

    def trunk(idx, pos, start, mask):
        # the mask's tables: static sizes (a symbolic one is mangled on the CPU, torch 2.13:
        # docs/torch_bugs/flex_cpu_symint_rename.py)
        for cell in getattr(mask, "__closure__", None) or ():
            if torch.is_tensor(cell.cell_contents) and cell.cell_contents.dim():
                torch._dynamo.mark_static(cell.cell_contents)
        # its inputs copied: a view's base is guarded on (another shape, another graph)
        return compiled(idx.clone(), pos.clone(), start, mask)
    model.trunk = trunk


def is_compiled(model):
    return "trunk" in vars(model) or "forward" in vars(model)


def eager_again(model):
    """Set aside what compile_static or compile_dynamic installed. -> a function that puts it
    back."""
    saved = {k: vars(model).pop(k) for k in ("trunk", "forward", "setup_cache") if k in vars(model)}
    return lambda: vars(model).update(saved)


def many_graphs(compiled, n=64):
    """Dynamo keeps at most 8 graphs per function, counted per code object: the target and the
    drafter share Transformer.trunk, and each mask kind is a graph of its own, so a SimSD
    run needs more; past the limit dynamo runs the function EAGER from then on and says so only
    in its log. This raises the limit to n only while `compiled` runs (when dynamo compiles
    it): nothing changes process-wide."""
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    return cfg.patch(**{name: max(getattr(cfg, name), n)})(compiled)


MODEL_COMPILES = ("auto", "static", "dynamic")     # how one model is compiled (compile_model)


def compile_model(model, how="auto"):
    """--compile: "static" shapes (compile_static; CUDA graphs on CUDA), or one
    "dynamic"-shape graph (compile_dynamic); "auto": static on CUDA, dynamic on
    the CPU (faster there: docs/results.md, "Compiled decoding")."""
    how = "auto" if how is True else how
    if how not in MODEL_COMPILES:
        raise ValueError(f"--compile {how!r}: choose from {', '.join(MODEL_COMPILES)}")
    cuda = model.embed.weight.is_cuda
    if how == "static" or (how == "auto" and cuda):
        compile_static(model, **dict(mode="reduce-overhead") if cuda else {})
    else:   # on a CPU, inductor's C++ wrapper: a compiled forward 5-12% faster (docs/results.md)
        compile_dynamic(model, options=dict(cpp_wrapper=not cuda))
