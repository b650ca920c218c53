"""Plain block-diffusion decoding: SDAR's block_diffusion_generate (docs/design.md, section 2).

DecodeRule is one denoising step; Session a model's cursor over its KV cache; round_loop the
loop every decoder shares (a round takes the open block, a Frontier, to the next one); generate
is plain decoding, the reference the speculative decoders are tested against. Values cross
between host and device only through to_host / to_device (tests/test_syncs.py counts them).
"""
import math
import time
from collections import Counter
from dataclasses import dataclass

import torch

import mask as masks

SYNCS = Counter()     # host syncs so far, by to_host (the decoders' stats: `syncs`)
EB_THRESHOLD = 0.35   # entropy_bounded's bound on a step's summed entropy (SDAR's default)


@dataclass
class DecodeRule:
    """One denoising step of SDAR's decoder: from a block's logits to its next state.

    Each masked position draws a token from `probs` (temperature, top-k / top-p; argmax when
    greedy), scored by SDAR's confidence: its probability under the temperature-scaled softmax
    over the WHOLE vocabulary, before top-k / top-p. The strategy picks the positions revealed:
      low_confidence_static   the step's quota (block_size / steps) of most confident ones;
      low_confidence_dynamic  every one above `threshold` (Fast-dLLM), at least the quota;
      random, sequential      the quota, drawn uniformly / leftmost first;
      entropy_bounded         surest first, the longest run whose summed entropy stays below
                              `eb_threshold`, at least one (the EB-sampler).
    Ties go to the leftmost position, a greedy token tie to the lowest id. A revealed token is
    never the mask token (SDAR's greedy path could reveal it, masking the position for good)."""
    mask_id: int
    block_size: int = 4
    strategy: str = "low_confidence_static"
    steps: int = None              # per block; default block_size (one token per step)
    threshold: float = 0.9
    eb_threshold: float = EB_THRESHOLD   # entropy_bounded's bound on summed entropy
    temperature: float = 0.0       # 0: greedy
    top_k: int = None
    top_p: float = None

    def __post_init__(self):
        self.steps = self.block_size if self.steps is None else self.steps
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose from "
                             f"{', '.join(STRATEGIES)}")
        if not 1 <= self.steps <= self.block_size:
            raise ValueError(f"steps must be in [1, block_size={self.block_size}], "
                             f"got {self.steps}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 < self.threshold <= 1 or self.eb_threshold <= 0:
            raise ValueError(f"threshold must be in (0, 1] and eb_threshold > 0, got "
                             f"{self.threshold} and {self.eb_threshold}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        base, extra = divmod(self.block_size, self.steps)     # SDAR's: the first steps take
        self.quota = [base + (s < extra) for s in range(self.steps)]   # the remainder

    def scaled(self, logits, no_mask=False):
        """fp32 logits / temperature (SDAR's confidence is their softmax over the whole
        vocabulary); no_mask: the mask token's at -inf (revealing it would reveal nothing)."""
        scaled = logits.float() / (self.temperature or 1)     # (/ 1: the same bits, a new tensor)
        if no_mask:
            scaled[..., self.mask_id] = -math.inf   # (a scalar index: no host-to-device copy)
        return scaled

    def probs(self, logits):
        """(n, V) logits -> (n, V) fp32 distribution tokens are drawn from: temperature, the
        mask token removed, then top-k and top-p (row by row: probs(x)[r] is probs(x[r]))."""
        logits = self.scaled(logits, no_mask=True)
        if self.top_k is not None:
            kth = logits.topk(min(self.top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -math.inf)
        if self.top_p is not None and self.top_p < 1:
            sorted_logits, order = logits.sort(descending=True)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            drop = cum - sorted_logits.softmax(-1) >= self.top_p   # keep the smallest nucleus
            logits = logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)
        return logits.softmax(-1)

    def best(self, logits):
        """(n,) each row's most likely non-mask token and its confidence (top-k and top-p
        never drop the most likely token)."""
        top, tokens = self.scaled(logits, no_mask=True).max(-1)
        return tokens, (top - self.scaled(logits).logsumexp(-1)).exp()

    def pick(self, logits, generator=None, noise=None):
        """Per row of (n, V) logits: a token drawn from `probs` (greedy: `best`'s) and its
        confidence. noise: the rows' (n, V) Exp(1) draws (default: drawn here)."""
        if self.temperature == 0:
            return self.best(logits)
        if noise is None:   # torch.multinomial's own draw (the same tokens on a CPU)
            noise = torch.empty_like(logits, dtype=torch.float).exponential_(generator=generator)
        tokens, scaled = (self.probs(logits) / noise).argmax(-1), self.scaled(logits)
        return tokens, (scaled.gather(-1, tokens[:, None])[:, 0] - scaled.logsumexp(-1)).exp()

    def __call__(self, logits, block, step, generator=None):
        """block: (..., B), mask_id where unknown; logits: (..., B, V) at every position, or packed:
        (M, V) at its M masked positions in order (shapes alike only if all are masked, when both
        agree); step: the step's index in the block. -> each block's next state, no host sync."""
        masked = block == self.mask_id                                  # (..., B)
        rows, packed = logits.flatten(0, -2), logits.shape[:-1] != block.shape   # (M, V)
        at = packed_index(block, self.mask_id) if packed else \
            torch.arange(block.numel(), device=block.device).view(block.shape)  # (..., B): its row
        noise = None
        if self.temperature:   # Exp(1) draws for every position (packed rows take theirs)
            noise = torch.empty(block.numel(), rows.shape[-1], device=rows.device).exponential_(
                generator=generator)
            noise = noise[packed_rows(block, self.mask_id, len(rows))] if packed else noise
        tokens, confidence = self.pick(rows, generator, noise)
        tokens, confidence = tokens[at], confidence[at]                 # (..., B)
        if self.strategy == "random":
            score = torch.rand(block.shape, generator=generator, device=block.device)
        elif self.strategy == "sequential":                              # leftmost first
            score = -torch.arange(block.shape[-1], device=block.device).float().expand(block.shape)
        elif self.strategy == "entropy_bounded":                         # -entropy: surest first
            p = self.probs(rows)
            score = (p * p.clamp(min=1e-30).log()).sum(-1)[at]
        else:
            score = confidence
        score = torch.where(masked, score, -math.inf)
        order = score.sort(dim=-1, descending=True, stable=True).indices  # ties: leftmost first
        if self.strategy == "entropy_bounded":     # the longest run under the bound, at least one
            run = (-score.gather(-1, order)).cumsum(-1) < self.eb_threshold
            run[..., 0] = True
            reveal = torch.zeros_like(masked).scatter_(-1, order, run)
        else:                                      # the step's quota (>= 1) of best positions
            best = order[..., :self.quota[min(step, self.steps - 1)]]
            reveal = torch.zeros_like(masked).scatter_(-1, best, True)
            if self.strategy == "low_confidence_dynamic":   # the threshold rule: the quota's
                reveal |= confidence > self.threshold       # best (so one at least) and all above
        return torch.where(reveal & masked, tokens, block)


def packed_rows(states, mask_id, n):
    """(n,) flat indices of the n masked positions of (..., B) `states`, in order: the rows a
    packed forward computes logits for. n is their count, known on the host: no host sync."""
    return (states != mask_id).flatten().int().argsort(stable=True)[:n]


def packed_index(states, mask_id):
    """(..., B) states -> (..., B): each masked position's row in logits packed in
    packed_rows' order (a known position gets a neighbour's row: it is never read)."""
    return ((states == mask_id).flatten().cumsum(0) - 1).clamp(min=0).view(states.shape)


STRATEGIES = ("low_confidence_static", "low_confidence_dynamic", "random", "sequential",
              "entropy_bounded")


class Session:
    """A model's decoding cursor over its KV cache: `committed` rows are final; a finished
    block waits in `pending` until the next forward carries it in as extra queries (fused
    commit), or gets a forward of its own (SDAR's): the same tokens in fp32 (tested)."""

    def __init__(self, model, block_size, max_len, fuse_commit=True):
        self.model, self.block_size, self.max_len = model, block_size, max_len
        self.fuse_commit = fuse_commit
        model.setup_cache(max_len)
        self.device = model.embed.weight.device
        self.committed, self.queries_at, self.pending, self.nfe = 0, 0, None, 0
        self.rows = Counter()   # query rows a forward -> forwards (bench.py's modelled GPU cost)

    def forward(self, tokens, pos, mask_for=None, *, keep, rows=None):
        """One forward of [pending ; tokens]. mask_for(prefix, n_commit) builds the mask_mod
        (prefix: committed rows; n_commit: the pending block's rows; default: block-causal);
        -> (keep, V) logits, or (M, V) for `rows` (M,) of the kept rows only (packed)."""
        mask_for = mask_for or (lambda prefix, _: masks.block_causal(self.block_size, prefix))
        n_commit = 0 if self.pending is None else len(self.pending)
        if n_commit:
            tokens = torch.cat([self.pending, tokens])
            pos = torch.cat([torch.arange(self.committed, self.committed + n_commit,
                                          device=self.device), pos])
        T = len(tokens)
        if self.committed + T > self.max_len:
            raise RuntimeError(f"{T} query rows after {self.committed} overflow the KV cache")
        # the mask's offsets as device tensors (a compiled kernel on a GPU cannot read CPU ones)
        mask = mask_for(*(to_device(x, self.device) for x in (self.committed, n_commit)))
        logits = self.model(tokens[None], pos, self.committed, mask, keep=keep, rows=rows)
        self.committed, self.pending = self.committed + n_commit, None
        self.queries_at = self.committed      # where the rows after the pending block were written
        self.nfe += 1
        self.rows[T] += 1
        return logits[0]

    def prefill(self, ids, now=True):     # now=False: the rows wait for the next forward
        if len(ids):
            self.pending = ids
            self.flush() if now else None

    def commit(self, block, copy=None):
        """The finished `block` joins the cache: from `copy`, the last forward's block of queries
        that held it complete, whose keys and values are exactly its own; else as pending rows
        of the next forward (fused commit), or in a forward of its own (SDAR's)."""
        if copy is not None and self.pending is None:
            B, kv, src = self.block_size, self.model.kv, self.queries_at + copy * self.block_size
            kv[..., self.committed:self.committed + B, :] = kv[..., src:src + B, :]
            self.committed += B
            return
        self.pending = block if self.pending is None else torch.cat([self.pending, block])
        if not self.fuse_commit:
            self.flush()

    def flush(self):   # a forward with nothing but the pending rows: SDAR's commit
        self.forward(self.pending[:0], self.pending[:0], keep=0)


def to_host(*tensors):
    """Tensors -> nested lists, with ONE host sync however many there are (each is copied
    without blocking, then the stream is waited for once). Counted in SYNCS."""
    SYNCS["host"] += 1
    host = [t.to("cpu", non_blocking=True) for t in tensors]
    for device in {t.device for t in tensors if t.is_cuda}:   # the stream of each GPU copied from
        torch.cuda.current_stream(device).synchronize()
    return [h.tolist() for h in host]


def to_device(rows, device):
    """A nested list of ints -> a long tensor on `device`, without a host sync (a plain
    copy from pageable memory waits for the GPU; one from pinned memory need not)."""
    t = torch.tensor(rows, dtype=torch.long)
    cuda = torch.device(device).type == "cuda"
    return t.pin_memory().to(device, non_blocking=True) if cuda else t.to(device)


def check_prompt(prompt, config, max_new_tokens):
    """Check the prompt on the host (ids in the vocabulary, no mask token, room for the
    generation); -> its ids, a host list (a tensor on a GPU: a sync a prompt)."""
    ids = prompt if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt) \
        else torch.as_tensor(prompt).flatten().tolist()
    if not ids:
        raise ValueError("empty prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not all(isinstance(i, int) and 0 <= i < config.vocab_size for i in ids):
        raise ValueError(f"prompt token ids must be in [0, {config.vocab_size}) (integers)")
    if config.mask_token_id in ids:
        raise ValueError("the prompt holds the mask token")
    if len(ids) + max_new_tokens > config.max_seq_len:
        raise ValueError(f"prompt ({len(ids)}) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"context of {config.max_seq_len} tokens")
    return ids


def stop_ids(config, eos_id=None):
    """The ids that end decoding: `eos_id` (one id or several) when given, else every id the
    checkpoint lists (config.stop_ids: a chat model's <|im_end|> too), else its eos_token_id."""
    if eos_id is None:
        return frozenset(config.stop_ids or (config.eos_token_id,))
    return frozenset((eos_id,) if isinstance(eos_id, int) else eos_id)


@dataclass
class Frontier:
    """Where decoding stands between rounds, besides the sessions' caches: the open block."""
    block: torch.Tensor   # (B,) the open block's state, mask_id where unknown
    pos: torch.Tensor     # (B,) its positions
    n_masked: int         # how many of them are masked (on the host)
    host: list = None     # `block` as a host list (every `host` field: a state, on the host)
    step: int = 0         # the rule's step index within the block
    ranks: tuple = ()     # the walk's extra rows here (spiffy.ranks: order, tokens, probs), host
    context: list = ()    # the ids before the open block, on the host


@dataclass
class Advance:
    """A round's result: the blocks it completed, as (state, host list, index of its complete
    copy in the round's verification forward or None), and the open block after."""
    done: list
    front: Frontier


def round_loop(one_round, sessions, prompt, rule, max_new_tokens, stops, on_block=None):
    """The round loop every decoder shares. Prefill the prompt's whole blocks (its tail stays
    in the open block as known tokens), then one_round(front, tokens_left) -> Advance, round
    after round (tokens_left: what max_new_tokens leaves past the open block); commit each block
    to every session; stop at a `stops` id, at max_new_tokens, or when on_block(new ids) says
    so. -> (new ids without the stop id, stats: stop, tokens, seconds, syncs, nfe, rows)."""
    B, mask_id, device = rule.block_size, rule.mask_id, sessions[0].device
    t0, syncs, n_prefix = time.perf_counter(), SYNCS["host"], len(prompt) // B * B

    def finish(out, stop):   # stop: "stop_id", "max_new_tokens" or "on_block"
        return out, dict(stop=stop, tokens=len(out), seconds=time.perf_counter() - t0,
                         syncs=SYNCS["host"] - syncs, nfe=sessions[0].nfe,
                         rows=dict(sessions[0].rows))
    for i, s in enumerate(sessions):      # a drafter's with its first forward (it may never run)
        s.prefill(to_device(prompt[:n_prefix], device), now=i == 0)
    out, known = [], len(prompt) - n_prefix          # known: prompt tokens in the open block
    host = prompt[n_prefix:] + [mask_id] * (B - known)
    front = Frontier(to_device(host, device), torch.arange(n_prefix, n_prefix + B, device=device),
                     B - known, host)
    seen = prompt[:n_prefix]                         # the ids before the open block
    while True:
        front.context = seen
        adv = one_round(front, max_new_tokens - len(out) - (B - known))
        front = adv.front
        done = adv.done + ([(front.block, front.host, None)] if not front.n_masked else [])
        for block, host, copy in done:      # the verifier keeps a block from its copy
            for i, s in enumerate(sessions):
                s.commit(block, copy if i == 0 else None)
            new, known, seen = host[known:], 0, seen + host
            end = next((i for i, t in enumerate(new) if t in stops), len(new))
            out += new[:end]
            if on_block and on_block(new[:end]):
                return finish(out[:max_new_tokens], "on_block")
            if end < len(new) or len(out) >= max_new_tokens:
                stopped = end < len(new) and len(out) < max_new_tokens
                return finish(out[:max_new_tokens], "stop_id" if stopped else "max_new_tokens")
        if not front.n_masked:
            front = Frontier(torch.full_like(front.block, mask_id), front.pos + B, B, [mask_id] * B)


@torch.no_grad()
def generate(model, prompt, max_new_tokens=64, rule=None, fuse_commit=True, eos_id=None,
             generator=None, on_block=None):
    """Plain block-diffusion decoding (SDAR's block_diffusion_generate), a forward and a step of
    `rule` a round (None: one token a step, greedy, as in every decoder's Python call; the command
    lines default to the threshold rule). fuse_commit: False for SDAR's commit forward; eos_id: the
    stop ids (default: stop_ids); on_block(new ids): each block's, True stops. -> (ids, stats)."""
    c = model.config
    rule = rule or DecodeRule(c.mask_token_id, c.block_size)
    ids, B = check_prompt(prompt, c, max_new_tokens), rule.block_size
    sess = Session(model, B, len(ids) + max_new_tokens + 3 * B, fuse_commit)

    def plain_round(front, tokens_left):              # logits at the masked positions only
        logits = sess.forward(front.block, front.pos, keep=B,
                              rows=packed_rows(front.block, rule.mask_id, front.n_masked))
        block = rule(logits, front.block, front.step, generator)
        host, = to_host(block)
        n_masked = host.count(rule.mask_id)
        return Advance([], Frontier(block, front.pos, n_masked, host, front.step + 1))

    return round_loop(plain_round, [sess], ids, rule, max_new_tokens, stop_ids(c, eos_id), on_block)
