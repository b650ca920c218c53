"""SimSD: speculative decoding of a block-diffusion LM with a small drafter dLLM.

Design notes, section 3 (after the SimSD paper). Per round, on the current block:
  draft   the drafter runs its own plain decoding on the block's masked positions, one token
          per step by confidence, for up to `gamma` steps; it records each drafted token d_i,
          its draft distribution p_draft(i) and its step label tau(i) (the step map);
  verify  ONE target forward over [data section | mask section] against the target's cache,
          under the token-level temporal mask (mask.simsd_temporal): the slot of position i
          sees the block as it was just before step tau(i), so its logits are p_target(i)
          "as if" at that step. Slots copy the RoPE position of their data token;
  accept  along tau: greedy match, or min(1, p_target(d) / p_draft(d)) with a residual
          resample at the first rejection (the correction); if every draft is accepted and
          masks remain, the most confident undrafted slot gives a bonus token;
  commit  the accepted positions (any subset of the block, not only a left prefix) become
          known; draft again until the block is full, then commit it to both caches (fused
          into each model's next forward by default).
Exactness: for a one-layer target, a slot's logits equal plain decoding's at step tau(i). For
deeper targets they are an approximation: a slot at step t also sees slots of later steps,
whose own hidden states were built from a context that holds data revealed after t. SimSD is
therefore not lossless; greedy output can differ from the target's plain decoding.

    python sample.py --spec simsd                  # on the embedded models
"""
import time
from collections import Counter
from dataclasses import dataclass

import torch

import mask as masks
from decode import DecodeRule, Session, check_prompt, decode


@dataclass
class Draft:
    pos: torch.Tensor       # (n,) block positions drafted this round, in draft order
    tokens: torch.Tensor    # (n,) drafted tokens d_i
    p_draft: torch.Tensor   # (n, V) the drafter's distribution at the step each was revealed
    tau: torch.Tensor       # (n,) step labels 1..n (the step map)


def draft(sess, block, pos, rule, gamma, generator=None):
    """The drafter's plain decoding, one token per step, for up to gamma steps."""
    block, drafted, tokens, p_draft = block.clone(), [], [], []
    n = min(gamma, int((block == rule.mask_id).sum()))  # host sync
    for _ in range(n):
        logits = sess.forward(block, pos, lambda c, k: masks.block_causal(rule.block_size, c),
                              keep=len(block))
        masked = (block == rule.mask_id).nonzero().squeeze(-1)
        p = rule.probs(logits[masked])                   # (m, V)
        tok, confidence = rule.pick(p, generator)
        best = confidence.argmax()
        block[masked[best]] = tok[best]
        drafted.append(masked[best]), tokens.append(tok[best]), p_draft.append(p[best])
    return Draft(torch.stack(drafted), torch.stack(tokens), torch.stack(p_draft),
                 torch.arange(1, n + 1, device=block.device))


def verify(sess, block, pos, d, rule, rope_copy=True):
    """ONE target forward over [data section | mask section]; -> (n_slots, V) logits, the
    drafted positions' slots first (in d's order), then one per undrafted masked position."""
    known = (block != rule.mask_id).nonzero().squeeze(-1)
    undrafted = block == rule.mask_id
    undrafted[d.pos] = False
    undrafted = undrafted.nonzero().squeeze(-1)
    zeros = torch.zeros_like
    data_idx, slot_idx = torch.cat([known, d.pos]), torch.cat([d.pos, undrafted])
    data_tok = block.clone()
    data_tok[d.pos] = d.tokens
    tokens = torch.cat([data_tok[data_idx], torch.full_like(slot_idx, rule.mask_id)])
    after_all = torch.full_like(undrafted, len(d.pos) + 1)  # undrafted: masks in every state
    step = torch.cat([zeros(known), d.tau, d.tau, after_all])
    is_slot = torch.cat([zeros(data_idx, dtype=torch.bool), torch.ones_like(slot_idx, dtype=torch.bool)])
    if rope_copy:
        slot_pos = pos[slot_idx]   # a slot takes the position of its data token
    else:                          # ablation: slots continue the sequence after the block
        slot_pos = pos[-1] + 1 + torch.arange(len(slot_idx), device=pos.device)
    return sess.forward(tokens, torch.cat([pos[data_idx], slot_pos]),
                        lambda c, n: masks.simsd_temporal(c, n, step, is_slot), keep=len(slot_idx))


def accept(logits, block, d, rule, generator=None):
    """Walk the drafts along tau; -> (new block, number of drafts accepted)."""
    n = len(d.pos)
    p_target = rule.probs(logits)                        # (n_slots, V)
    block, accepted = block.clone(), n
    if rule.temperature == 0:
        match = (p_target[:n].argmax(-1) == d.tokens).int().cumprod(0)
        accepted = int(match.sum())                      # host sync
    else:
        p_t = p_target[torch.arange(n), d.tokens]
        p_d = d.p_draft[torch.arange(n), d.tokens]
        u = torch.rand(n, generator=generator, device=p_t.device)
        ok = (u < (p_t / p_d).clamp(max=1)).int().cumprod(0)
        accepted = int(ok.sum())                         # host sync
    block[d.pos[:accepted]] = d.tokens[:accepted]
    if accepted < n:       # the correction, from the residual max(0, p_target - p_draft)
        i = accepted
        residual = p_target[i] if rule.temperature == 0 else (p_target[i] - d.p_draft[i]).clamp(min=0)
        if residual.sum() == 0:
            residual = p_target[i]
        tok, _ = rule.pick((residual / residual.sum())[None], generator)
        block[d.pos[i]] = tok[0]
    elif len(logits) > n:  # all accepted, masks remain: bonus from the undrafted slots
        tok, confidence = rule.pick(p_target[n:], generator)
        best = confidence.argmax()
        block[(block == rule.mask_id).nonzero().squeeze(-1)[best]] = tok[best]
    return block, accepted


@torch.no_grad()
def simsd_generate(target, drafter, prompt, max_new_tokens=64, rule=None, gamma=None,
                   rope_copy=True, order="tau", fuse_commit=True, eos_id=None, generator=None,
                   on_block=None):
    """SimSD decoding. target, drafter: Transformers sharing a tokenizer (batch 1).
    rule: a DecodeRule for block size, temperature, top-k, top-p (its strategy is not used:
    SimSD reveals by the draft order). gamma: most tokens drafted per round (default B).
    rope_copy=False, order="position": the paper's ablations (slots get their own
    positions; verify and accept left to right instead of by tau).
    Returns (new token ids, stats)."""
    c = target.config
    rule = rule or DecodeRule(c.mask_token_id, c.block_size)
    B, gamma = rule.block_size, rule.block_size if gamma is None else gamma
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    if order not in ("tau", "position"):
        raise ValueError(f"order must be 'tau' or 'position', got {order!r}")
    if drafter.config.mask_token_id != c.mask_token_id or drafter.config.vocab_size != c.vocab_size:
        raise ValueError("drafter and target differ in vocabulary size or mask token id")
    ids = check_prompt(prompt, c, max_new_tokens, target.embed.weight.device)
    t0, hist = time.perf_counter(), Counter()
    tsess = Session(target, B, len(ids) + max_new_tokens + 4 * B, fuse_commit)
    dsess = Session(drafter, B, len(ids) + max_new_tokens + 3 * B, fuse_commit)

    def fill_block(block, pos):
        while (block == rule.mask_id).any():             # host sync
            d = draft(dsess, block, pos, rule, gamma, generator)
            if order == "position":                      # ablation: left-to-right step map
                d = Draft(*(t[d.pos.argsort()] for t in (d.pos, d.tokens, d.p_draft)), d.tau)
            logits = verify(tsess, block, pos, d, rule, rope_copy)
            block, n_accepted = accept(logits, block, d, rule, generator)
            hist[n_accepted] += 1
        return block

    eos = c.eos_token_id if eos_id is None else eos_id
    out = decode(fill_block, [tsess, dsess], ids, B, max_new_tokens, rule.mask_id, eos, on_block)
    seconds, rounds = time.perf_counter() - t0, sum(hist.values())
    return out, dict(nfe=tsess.nfe, nfe_draft=dsess.nfe, tokens=len(out), seconds=seconds,
                     rounds=rounds, accept_hist=dict(sorted(hist.items())),
                     mean_accepted=sum(k * v for k, v in hist.items()) / max(rounds, 1),
                     tokens_per_s=len(out) / seconds)
