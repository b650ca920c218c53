"""SimSD: speculative decoding of a block-diffusion LM with a small drafter dLLM.

docs/design.md, section 3 (after the SimSD paper). The drafter is a proposer for the round loop
(decode.round_loop): each round, on the frontier,
  draft   the drafter runs its own decoding on the open block's masked positions: each forward
          reveals its most confident position (and, with `draft_threshold`, every other one
          above it) until `gamma` tokens are drafted or its confidence falls below
          `draft_stop`; a block drafted whole goes on into the next (`lookahead` blocks). It
          records each drafted token d_i, its draft distribution p_draft(i) and its step label
          tau(i) (the step map).
  verify  its states X_t, X_t + d_1, X_t + d_1 + d_2, ... (and the next block's, after a
          complete one) as whole-block copies, in ONE target forward (verify.verify_copies):
          the target's exact logits in every state the drafter passed through.
  walk    the target's own rule from X_t, through every drafted state it reaches, across the
          block boundary (verify.walk, as in Spiffy): output identical to plain decoding,
          token for token in fp32 (bf16 rounding: see verify.py). A draft counts as accepted
          when the walk passed through a state holding it.
The paper's own verifier (the temporal mask) and acceptance rules (paper, gated), which are not
lossless, are simsd_paper.py; simsd_generate runs either. Host syncs: the drafter reads its
confidences back each forward; the walk once a step (fast.walk: once a round, greedy).

    python sample.py --spec simsd                  # on the embedded models
"""
import bisect
import time
from collections import Counter
from functools import partial

import torch

import mask as masks
from decode import (SYNCS, DecodeRule, Session, check_prompt, copies_cap, packed_index, prompt_list,
                    round_loop, stop_ids, to_device, to_host)
from drafts import (LOOKUP_N, REFERENCES, Draft, lookup_draft, point, trajectory, weighed,
                    worth_verifying)
from simsd_paper import GATE, accept_gated, accept_paper, copies_round, draw, temporal_round
from verify import lossless_round, no_extra, walk

VERIFIERS, ACCEPTS = ("temporal", "copies"), ("paper", "gated", "lossless")
DRAFT_THRESHOLD, DRAFT_STOP = 0.5, 0.3   # measured on the embedded pair (docs/results.md)
LOOKAHEAD = 3   # blocks drafted past the open one (docs/results.md: chosen by measurement)


def draft(sess, block, pos, rule, gamma, draft_threshold=None, draft_stop=None, generator=None,
          lookahead=0, stops=(), cost=None, host=None):
    """The drafter's decoding, for up to gamma tokens. Positions are ranked by the confidence of
    their most likely token, not of the token drawn there, so which position gets drafted does
    not depend on the draw: the proposal at a drafted position is exactly p_draft, as
    speculative sampling needs. Each forward drafts the best position plus every other above
    draft_threshold; drafting stops once the best confidence left is below draft_stop.
    lookahead: once the block is drafted whole (and holds none of the `stops` ids), draft on
    into up to that many later blocks, the drafted block committed to the drafter's cache
    tentatively; the cache is rolled back after (the static cache's rows are overwritten).
    cost (a cost table): also stop once a step's last draft is not worth verifying (later ones
    are less likely still). host: `block` on the host, where the caller has it (no sync)."""
    B, block, rows, per_block, base = rule.block_size, block.clone(), [], [0], None
    chance, ends, where, tau = [], [], [], []                        # host lists
    host = to_host(block)[0] if host is None else host             # (the round loop's copy)
    masked = [i for i, t in enumerate(host) if t == rule.mask_id]
    left = min(gamma, len(masked) + lookahead * B)
    while left > 0:
        if not masked:                                               # drafted whole: on, ahead
            if len(per_block) > lookahead or stops and stops.intersection(to_host(block)[0]):
                break
            base = sess.committed if base is None else base
            sess.commit(block)                                       # tentatively
            block, pos, masked = torch.full_like(block, rule.mask_id), pos + B, list(range(B))
            per_block.append(0)
        at = to_device(masked, block.device)                         # (m,): the rows read
        logits = sess.forward(block, pos, lambda c, k: masks.block_causal(B, c), keep=B, rows=at)
        conf, order = rule.top_confidence(logits).sort(descending=True, stable=True)
        conf, order_h = to_host(conf, order)                         # the one sync a step
        n = min(1 + sum(c > draft_threshold for c in conf[1:]) if draft_threshold else 1, left)
        take, drafted = order[:n], [masked[j] for j in order_h[:n]]
        p = rule.probs(logits)[take]                                 # (n, V): the drafted rows
        tok = p.argmax(-1) if rule.temperature == 0 else draw(p, generator)
        block[at[take]] = tok
        rows.append((tok, p))
        where += [i + B * (len(per_block) - 1) for i in drafted]     # the position, blocks on
        masked = [i for i in masked if i not in drafted]             # (n <= B entries)
        per_block[-1], left = per_block[-1] + n, left - n
        tau, ends = tau + [len(rows)] * n, ends + [False] * (n - 1) + [True]  # tau, step_end
        if cost:
            last = chance[-1] if chance else 1.0
            chance += [last * c for c in p.gather(-1, tok[:, None]).squeeze(-1).cumprod(0).tolist()]
            if len(chance) - 1 not in worth_verifying(weighed(chance, ends), per_block, cost):
                break
        if draft_stop and n < len(conf) and conf[n] < draft_stop:
            break
    if base is not None:                                             # roll the cache back
        sess.committed, sess.pending = base, None
    (tokens, p), (where, tau) = map(torch.cat, zip(*rows)), to_device([where, tau], block.device)
    return Draft(where, tokens, p, tau, per_block, rule.mask_id, chance or None, step_end=ends)


def propose_drafts(dsess, rule, draft_kw, lookahead, stops, cost=None, max_copies=None):
    """The drafter as a proposer: (front, room) -> the Draft of the open block (draft), never
    past the `room` max_new_tokens leaves, cut to the prefix whose states fit `max_copies`
    copies (capped), then to the prefix worth verifying (Draft.sized) by the cost model
    `cost`, if one is given."""
    B = rule.block_size

    def drafts(front, room):
        ahead = min(lookahead, max(0, -(-room // B)))               # blocks of room left
        d = draft(dsess, front.block, front.pos, rule, **draft_kw, lookahead=ahead, stops=stops,
                  cost=cost, host=front.host)
        d = capped(d, max_copies)
        return d.sized(cost) if cost else d
    return drafts


def capped(d, max_copies):
    """The longest prefix of Draft d whose states fit in max_copies block copies (None: d)."""
    k = len(d.pos)
    while max_copies is not None and k and len(d.prefix(k).kept_copies()) > max_copies:
        k -= 1
    return d if k == len(d.pos) else d.prefix(k)


def accepted(g, w):
    """How many drafts of a round the walk w accepted: the most any state it reached holds
    (a threshold step may reveal several drafts at once). Host values only."""
    d, n = g.data, len(w.copies)
    _, parent, src = d.layout(g.counts[0], len(w.host))
    held = [bisect.bisect_left(src, c) for c in range(n)]   # drafts revealed in copy c (src rises)
    last_block = w.crossed[-1][1] if w.crossed else -1
    parent = parent or [-1] * n
    ended_on = [c for c in range(n) if w.copies[c] == w.host and parent[c] == last_block]
    return max((held[c] for c in w.visited + ended_on), default=0), len(src)


def check_settings(verifier, acceptance, gamma, gate, draft_threshold, draft_stop, rope_copy, order,
                   lookahead=None, reference="drafter", lookup_n=None):
    """Refuse settings that are unknown or that the chosen verifier cannot honour."""
    if reference not in REFERENCES:
        raise ValueError(f"unknown --reference {reference!r}; choose from {', '.join(REFERENCES)}")
    if lookup_n is not None and (type(lookup_n) is not int or lookup_n < 1):
        raise ValueError(f"--lookup-n must be an integer >= 1, got {lookup_n!r}")
    if reference != "drafter" and acceptance in ("paper", "gated") and verifier == "copies":
        raise ValueError(f"--reference {reference} runs --verify copies --accept lossless or "
                         f"--verify temporal --accept paper, not --accept {acceptance} on copies")
    if lookahead is not None and (type(lookahead) is not int or lookahead < 0):
        raise ValueError(f"--lookahead must be an integer >= 0, got {lookahead!r}")
    if lookahead and verifier == "temporal":
        raise ValueError("--lookahead needs --verify copies: the temporal mask verifies one block")
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier (--verify) {verifier!r}; choose from "
                         f"{', '.join(VERIFIERS)}")
    if acceptance not in ACCEPTS:
        raise ValueError(f"unknown acceptance rule (--accept) {acceptance!r}; choose from "
                         f"{', '.join(ACCEPTS)}")
    if order not in ("tau", "position"):
        raise ValueError(f"order must be 'tau' or 'position', got {order!r}")
    if verifier == "temporal" and acceptance != "paper":
        raise ValueError(f"--verify temporal needs --accept paper (not {acceptance}): the temporal "
                         "mask gives no exact logits of the whole block at a drafted state")
    if verifier == "copies" and (not rope_copy or order != "tau"):
        raise ValueError("the rope-copy and order ablations apply to the temporal verifier only")
    if gamma is not None and gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    for name, x in (("gate", gate), ("draft_threshold", draft_threshold),
                    ("draft_stop", draft_stop)):
        if x is not None and not 0 < x <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {x}")


def propose_reference(reference, rule, lookahead, stops, lookup_n, cost, vocab, temporal,
                      max_copies=None):
    """A drafter-free source (drafts.py: "trajectory" or "lookup") as a proposer, like
    propose_drafts; on the temporal path within the open block, point proposals (one-hot
    p_draft), and lookup's drafts left to right."""
    B = rule.block_size

    def drafts(front, room):
        ahead = 0 if temporal else min(lookahead, max(0, -(-room // B)))
        d = trajectory(front, rule, ahead, stops) if reference == "trajectory" else \
            lookup_draft(front, rule, lookup_n, ahead, stops, hinted=not temporal)
        d = d if temporal else capped(d, max_copies)
        d = d.sized(cost) if cost and len(d.tau) else d
        return point(d, vocab) if temporal else d
    return drafts


def check_reference(reference, drafter, config):
    """A drafter exactly when the reference is one, and of the target's vocabulary."""
    if reference == "drafter" and drafter is None:
        raise ValueError("--reference drafter needs a drafter (or choose --reference trajectory "
                         "or lookup: no second model)")
    if reference != "drafter" and drafter is not None:
        raise ValueError(f"a drafter was given with --reference {reference}, which needs none")
    if drafter is not None and (drafter.config.mask_token_id, drafter.config.vocab_size) != (
            config.mask_token_id, config.vocab_size):
        raise ValueError("drafter and target differ in vocabulary size or mask token id")


def simsd_round(tsess, drafts, rule, verifier, acceptance, gate, rope_copy, order, generator,
                extra=no_extra, walk=walk):
    """SimSD's round for the loop, by verifier and acceptance rule, on the proposer `drafts`
    ((front, room) -> Draft); extra: the walk's (the hint the next round's drafts read).
    -> round_(front, room) -> (decode.Advance, drafts accepted, why the round ended; None on
    the temporal mask)."""
    if verifier == "temporal":
        return temporal_round(tsess, drafts, rule, order, rope_copy, generator, extra)
    if acceptance != "lossless":
        rules = dict(paper=accept_paper, gated=partial(accept_gated, gate=gate))
        return copies_round(tsess, drafts, rule, rules[acceptance], generator)
    walked = lossless_round(tsess, rule, lambda front, room: drafts(front, room).guesses(
        front.block, front.n_masked), generator, extra, walk)

    def round_(front, room):         # draft, verify as block copies, walk the target's own rule
        adv, g, w = walked(front, room)
        n, of = accepted(g, w)
        why = "every draft accepted" if n == of else "state not verified" if g.data.cut_at(
            g.copies[0], len(w.crossed), w.host) else "target chose otherwise"
        cut = g.data.proposed                         # drafts there were, before sizing
        return adv, n, why if of else "none worth verifying" if cut else "nothing proposed"
    return round_


@torch.no_grad()
def simsd_generate(target, drafter, prompt, max_new_tokens=64, rule=None, verifier="copies",
                   acceptance="lossless", gamma=None, gate=GATE, draft_threshold=DRAFT_THRESHOLD,
                   draft_stop=DRAFT_STOP, rope_copy=True, order="tau", fuse_commit=True,
                   eos_id=None, generator=None, on_block=None, lookahead=None, cost=None, walk=walk,
                   copy_commit=True, reference="drafter", lookup_n=LOOKUP_N, max_rows=None):
    """SimSD decoding. target, drafter: Transformers sharing a tokenizer (batch 1); drafter None
    with a drafter-free `reference` (drafts.py: trajectory, lookup up to lookup_n-grams). rule:
    the target's DecodeRule, the drafter's too. verifier, acceptance: the module docstrings;
    gamma: most tokens drafted a round (default B x (1 + lookahead)); gate, draft_threshold,
    draft_stop: accept_gated, draft. lookahead: blocks past the open one drafts may reach
    (copies; default LOOKAHEAD). cost: a cost model (costs.py) sizing the drafts (None: all
    verified). copy_commit: decode.Session.commit. rope_copy, order: the paper's ablations.
    max_rows: the most query rows of a verification's copies (None: no cap; a GPU's: cli.py).
    walk: verify's or fast's. generator: the target's stream. -> (new ids, stats)."""
    c = target.config
    rule = rule or DecodeRule(c.mask_token_id, c.block_size)
    check_settings(verifier, acceptance, gamma, gate, draft_threshold, draft_stop, rope_copy, order,
                   lookahead, reference, lookup_n)
    check_reference(reference, drafter, c)
    B, temporal = rule.block_size, verifier == "temporal"
    lookahead = (0 if temporal else LOOKAHEAD) if lookahead is None else lookahead
    max_copies = None if temporal else copies_cap(max_rows, B)
    gamma = min(B * (1 + lookahead) if gamma is None else gamma,
                max(1, (max_copies or float("inf")) - 1))
    ids, syncs = check_prompt(prompt, c, max_new_tokens, target.embed.weight.device), SYNCS["host"]
    t0, hist, ends, stops = time.perf_counter(), Counter(), Counter(), stop_ids(c, eos_id)
    scratch = (4 if temporal else min(gamma + lookahead + 1, max_copies or gamma + B) + 3) * B
    sessions = [Session(target, B, len(ids) + max_new_tokens + scratch, fuse_commit, copy_commit)]
    cost, extra = None if temporal else cost, no_extra
    if reference == "drafter":
        sessions.append(Session(drafter, B, len(ids) + max_new_tokens + (lookahead + 3) * B,
                                fuse_commit))
        draft_kw = dict(gamma=gamma, draft_threshold=draft_threshold, draft_stop=draft_stop,
                        generator=drafters_stream(generator))
        drafts = propose_drafts(sessions[1], rule, draft_kw, lookahead, stops, cost, max_copies)
    else:
        drafts = propose_reference(reference, rule, lookahead, stops, lookup_n, cost,
                                   c.vocab_size, temporal, max_copies)
        extra = extra if reference == "lookup" and temporal else ranked(rule)
    round_ = tallied(simsd_round(sessions[0], drafts, rule, verifier, acceptance, gate, rope_copy,
                                 order, generator, extra, walk), hist, ends)
    context = prompt_list(prompt) if reference == "lookup" else None
    out, stop = round_loop(round_, sessions, ids, rule, max_new_tokens, stops, on_block, context)
    seconds, rounds, (tsess, *dsess) = time.perf_counter() - t0, sum(hist.values()), sessions
    return out, dict(stop=stop, nfe=tsess.nfe, nfe_draft=sum(s.nfe for s in dsess), rows=dict(
        tsess.rows), rows_draft=dict(dsess[0].rows) if dsess else {}, tokens=len(out),
        seconds=seconds, rounds=rounds, accept_hist=dict(sorted(hist.items())), lookahead=lookahead,
        round_ends={k: v for k, v in ends.items() if v}, tokens_per_s=len(out) / seconds,
        reference=reference, mean_accepted=sum(k * v for k, v in hist.items()) / max(rounds, 1),
        syncs=SYNCS["host"] - syncs)


def tallied(round_, hist, ends):
    """round_ for the loop, counting drafts accepted (hist) and why rounds end (ends)."""
    def tally(front, room):
        adv, n, why = round_(front, room)
        hist[n], ends[why] = hist[n] + 1, ends[why] + (why is not None)
        return adv
    return tally


def drafters_stream(generator):
    """The drafter's random stream, seeded from the target's (None: greedy)."""
    return None if generator is None else torch.Generator(generator.device).manual_seed(
        generator.initial_seed() + 1)


def ranked(rule):
    """The walk's `extra` for the drafter-free references: each new state's positions by the
    confidence of their best token under the logits it was stepped from (masked ones first),
    each one's best token and its confidence ((..., B), (..., B, 1), (..., B, 1): spiffy.ranks'
    shapes, in one pass over the logits: DecodeRule.best)."""
    def extra(logits, copies, states):
        tokens, conf = rule.best(logits)
        at = packed_index(copies, rule.mask_id)                    # (..., B): each one's row
        conf = conf[at].masked_fill(states != rule.mask_id, -1.0)
        order = conf.sort(dim=-1, descending=True, stable=True).indices
        return order, tokens[at].gather(-1, order)[..., None], conf.gather(-1, order)[..., None]
    return extra
