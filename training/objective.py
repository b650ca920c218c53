"""The BD3-LM / SDAR training objective and its batches (docs/design.md, section 5): what
train.py trains with and training/report.py evaluates with.

- Batches: random windows of clean tokens x_0 from a uint16 token file; for stage two the
  question of each arithmetic document is marked (mark_prompts) so it is never noised, and
  the answer tokens the question holds (copied, of entity_ids) can weigh more.
- noise: x_t, each token of each block of B masked with that block's t ~ U(eps, 1).
- bd3lm_loss: the cross-entropy on the masked positions of x_t, the model reading
  [x_t ; x_0] under the BD3-LM mask (bd3lm_training); BLOCK_SIZES are the block sizes
  trained, one drawn per batch.
- distill_loss: the drafter's loss distilled from a frozen target on the same x_t, (1 - w)
  times that cross-entropy plus w times KL(p_target || p_drafter) (train.py --distill).

References: BD3-LM (Arriola et al., block discrete denoising diffusion), SDAR (JetLM); token-level
knowledge distillation of drafters: DistillSpec (Zhou et al., 2023).
"""
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import mask as masks
from training.tasks import ENTITIES

BLOCK_SIZES = (4, 8, 32)


def bd3lm_training(block_size, n):
    """The BD3-LM training mask over [x_t ; x_0] (2n tokens), in the paper's three parts:
    block-diagonal (noisy sees its own noisy block), offset block-causal (noisy block b sees
    clean blocks < b) and block-causal (clean sees clean blocks <= b)."""
    def bd3lm_training_mask(b, h, q_idx, kv_idx):
        q_noisy, kv_noisy = q_idx < n, kv_idx < n
        qb = torch.where(q_noisy, q_idx, q_idx - n) // block_size
        kb = torch.where(kv_noisy, kv_idx, kv_idx - n) // block_size
        block_diagonal = q_noisy & kv_noisy & (qb == kb)
        offset_block_causal = q_noisy & ~kv_noisy & (kb < qb)
        clean_block_causal = ~q_noisy & ~kv_noisy & (kb <= qb)
        return block_diagonal | offset_block_causal | clean_block_causal
    return bd3lm_training_mask


class Batches:
    """Random windows of `seq_len` tokens from a uint16 token file (documents joined by EOS).
    Calls return (x, prompt, weight): with answer_ids, prompt marks the question of each
    arithmetic document (through "Answer:"), which stage two never masks (mark_prompts), and
    weight is copy_weight at each of `copy_ids` in an answer that its question holds, else 1."""

    def __init__(self, path, seq_len, seed, vocab_size=None, answer_ids=(), eos_id=None, pad=0,
                 copy_ids=(), copy_weight=1.0):
        path = Path(path)
        if not path.is_file() or path.stat().st_size == 0:
            raise FileNotFoundError(f"corpus file {path} is missing or empty (run tools/prepare.py)")
        if path.stat().st_size % 2:
            raise ValueError(f"corpus file {path} is not uint16 tokens (odd size)")
        self.data = np.fromfile(path, dtype=np.uint16)
        if len(self.data) < seq_len + 1:
            raise ValueError(f"corpus file {path} is shorter than one window of {seq_len}")
        if vocab_size is not None and self.data.max() >= vocab_size:
            raise ValueError(f"corpus file {path} holds token id {self.data.max()}, outside the "
                             f"vocabulary of {vocab_size}")
        self.seq_len, self.rng = seq_len, np.random.default_rng(seed)
        self.prompt = np.zeros(len(self.data), bool)
        if answer_ids:
            self.data, self.prompt = mark_prompts(self.data, answer_ids, eos_id, pad)
        self.weight = np.where(copied(self.data, self.prompt, eos_id, copy_ids), copy_weight, 1).astype(np.float32)

    def __call__(self, batch_size):
        idx = self.rng.integers(0, len(self.data) - self.seq_len, batch_size)
        x, prompt, weight = (np.stack([a[i:i + self.seq_len] for i in idx])
                             for a in (self.data, self.prompt, self.weight))
        return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(prompt), torch.from_numpy(weight)


def mark_prompts(data, answer_ids, eos_id, pad=0):
    """-> (data, prompt): prompt is True from the start of each document that holds
    `answer_ids` through those ids. With pad, `pad` more EOS follow each such document, as
    SDAR's fine-tuning pads a response with EOS: decoding then reveals the rest of an answer's
    last block (all EOS) at once instead of guessing the next document there."""
    n = len(answer_ids)
    hits = np.flatnonzero(np.all([data[i:len(data) - n + 1 + i] == a
                                  for i, a in enumerate(answer_ids)], 0))
    eos = np.flatnonzero(data == eos_id)
    doc = np.searchsorted(eos, hits)                   # the EOS ending each hit's document
    starts = np.concatenate([[0], eos + 1])[doc]
    edges = np.zeros(len(data) + 1, np.int32)
    np.add.at(edges, starts, 1)
    np.add.at(edges, hits + n, -1)
    prompt = np.cumsum(edges[:-1]) > 0
    at = np.repeat(eos[doc[doc < len(eos)]] + 1, pad)
    return np.insert(data, at, eos_id), np.insert(prompt, at, False)


def copied(data, prompt, eos_id, ids):
    """True at each answer token (after a question, before its document's EOS) that is one
    of `ids` (the people and things of the problems) and that the question holds."""
    out = np.zeros(len(data), bool)
    if not len(ids):
        return out
    edges = np.diff(prompt.astype(np.int8), prepend=0, append=0)
    eos = np.flatnonzero(data == eos_id)
    for s, e in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
        end = eos[np.searchsorted(eos, e)] if e <= eos[-1] else len(data)
        out[e:end] = np.isin(data[e:end], data[s:e]) & np.isin(data[e:end], ids)
    return out


def entity_ids(tok):
    """The token ids of the people and things the arithmetic problems name (" Max", " pears")."""
    return np.array(sorted({i for words in ENTITIES.values() for w in words for i in tok.encode(" " + w)}))


def noise(x0, block_size, mask_id, generator, keep=None, eps=1e-3, order=None):
    """x_t: mask each token of each block with that block's t ~ U(eps, 1), never where `keep`
    is True. order: (b, L) scores; then a block's masked positions are its round(t B) lowest
    scored, at least one (a decoder's state: what it reveals last is still masked). The
    draws are made on x0's device, so `generator` must live there too."""
    b, L = x0.shape
    if L % block_size:
        raise ValueError(f"sequence length {L} is not a multiple of the block size {block_size}")
    t = torch.rand(b, L // block_size, 1, generator=generator, device=x0.device) * (1 - eps) + eps
    if order is not None:     # rank within its block, lowest score first, against t's share
        rank = order.view(b, -1, block_size).argsort(-1).argsort(-1)
        masked = (rank < (t * block_size).round().clamp(min=1)).view(b, L)
    else:
        masked = torch.rand(b, L, generator=generator, device=x0.device) < t.expand(-1, -1, block_size).reshape(b, L)
    if keep is not None:
        masked &= ~keep
    return torch.where(masked, mask_id, x0), masked


def noised_forward(model, x0, block_size, generator, keep=None, teacher_order=None):
    """x_t drawn from x0 (noise), then model's logits at the x_t rows of [x_t ; x_0] under the
    BD3-LM mask. -> (logits (b, L, V), masked (b, L), run): run(other) gives another model's
    logits on exactly the same input (the teacher's in distill_loss)."""
    L, mask_id = x0.shape[1], model.config.mask_token_id
    pos = torch.arange(L, device=x0.device).repeat(2)
    to_mask = masks.block_mask if x0.is_cuda else masks.dense_mask  # CPU flex has no backward
    mask = to_mask(bd3lm_training(block_size, L), 2 * L, 2 * L, x0.device)
    run = lambda m, xt: m(torch.cat([xt, x0], 1), pos, mask=mask)[:, :L]   # noqa: E731
    order = None
    if teacher_order is not None:   # its confidence in x0 with the answer masked; the prompt last
        with torch.no_grad():
            logits = run(teacher_order, x0.masked_fill(~keep, mask_id)).float()
            order = logits.log_softmax(-1).gather(-1, x0[..., None]).squeeze(-1).masked_fill(keep, math.inf)
    xt, masked = noise(x0, block_size, mask_id, generator, keep, order=order)
    return run(model, xt), masked, lambda m: run(m, xt)


def cross_entropy(logits, x0, masked, weight=None):
    """Mean cross-entropy to x0 on the masked positions, weighted by `weight` (b, L) if given."""
    if weight is None:
        return F.cross_entropy(logits[masked], x0[masked])
    w = weight[masked]
    return (F.cross_entropy(logits[masked], x0[masked], reduction="none") * w).sum() / w.sum()


def bd3lm_loss(model, x0, block_size, generator, keep=None, weight=None):
    """Mean cross-entropy on the masked positions of x_t, with the [x_t ; x_0] input;
    weighted by `weight` (b, L) where given."""
    logits, masked, _ = noised_forward(model, x0, block_size, generator, keep)
    return cross_entropy(logits, x0, masked, weight)


def kl(teacher_logits, logits):
    """Mean over rows of KL(p_teacher || p_model), in fp32 (rows: (n, V) logits)."""
    p, q = (F.log_softmax(z.float(), -1) for z in (teacher_logits, logits))
    return F.kl_div(q, p, reduction="none", log_target=True).sum(-1).mean()


def distill_loss(model, teacher, x0, block_size, generator, keep=None, weight=None, distill_weight=1.0,
                 ordered=False):
    """Token-level distillation on bd3lm_loss's input: the frozen teacher reads the same
    [x_t ; x_0] (no grad) and the loss on the masked positions of x_t is (1 - w) * the
    (weighted) cross-entropy to x_0 + w * KL(p_teacher || p_model), the KL unweighted: its
    gradient is the cross-entropy's to the teacher's softmax. -> (loss, KL), the KL detached."""
    logits, masked, run = noised_forward(model, x0, block_size, generator, keep, teacher if ordered else None)
    with torch.no_grad():
        teacher_logits = run(teacher)[masked]
    div = kl(teacher_logits, logits[masked])
    loss = (1 - distill_weight) * cross_entropy(logits, x0, masked, weight) + distill_weight * div
    return loss, div.detach()


@torch.no_grad()
def held_out_kl(model, teacher, splits, seq_len, batch_size, n_batches, seed=0):
    """KL(p_teacher || p_model) on the masked positions, per (split, block size), on the
    windows and noise report.evaluate scores its loss on (same seed, same draws)."""
    was_training, out, dev = model.training, {}, model.embed.weight.device
    model.eval()
    for name, (path, answer_ids) in splits.items():
        batches = Batches(path, seq_len, seed, answer_ids=answer_ids, eos_id=model.config.eos_token_id)
        xs = [batches(batch_size) for _ in range(n_batches)]
        for B in BLOCK_SIZES:
            g = torch.Generator(dev).manual_seed(seed)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                kls = [distill_loss(model, teacher, x.to(dev), B, g, keep.to(dev))[1] for x, keep, _ in xs]
            out[f"kl/{name}/B{B}"] = sum(k.item() for k in kls) / n_batches
    model.train(was_training)
    return out
