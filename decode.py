"""Plain block-diffusion decoding: SDAR's block_diffusion_generate (docs/design.md, section 2).

- `DecodeRule`: one denoising step, from a block's logits to its next state.
- `Session`: a model's cursor over its static KV cache, with the commit forward optionally
  fused into the next block's first forward (one forward a block less than SDAR's loop).
- `round_loop`: the round loop every decoder shares (plain, SimSD, Spiffy) over a `Frontier` (the
  open block; the committed cache lives in the sessions): a round takes the frontier to the
  next one and says which blocks it completed; the loop commits them and decides the stop.
- `generate`: plain decoding, the reference the speculative decoders are tested against: a
  round is one forward and one step of the rule.
- `to_host` / `to_device`: the only ways values cross between host and device while decoding:
  one host sync per target forward in plain decoding (tests/test_syncs.py counts them).
"""
import math
import time
from collections import Counter
from dataclasses import dataclass, replace

import torch

import mask as masks

SYNCS = Counter()     # host syncs so far, by to_host (the decoders' stats: `syncs`)
EB_THRESHOLD = 0.35   # entropy_bounded's bound on a step's summed entropy (SDAR's default)


@dataclass
class DecodeRule:
    """One denoising step of SDAR's decoder: from a block's logits to its next state.

    For every masked position a token is drawn from `probs` (temperature, then top-k / top-p;
    argmax when greedy) and scored by SDAR's confidence: the token's probability under the
    temperature-scaled softmax over the WHOLE vocabulary, mask token included, before top-k /
    top-p. The strategy picks the positions to reveal (SDAR's names and parameters):
      low_confidence_static   the `steps`-quota most confident masked positions;
      low_confidence_dynamic  every position whose confidence is strictly above `threshold`
                              (Fast-dLLM's threshold rule), and at least the static quota;
      random                  the quota of positions drawn uniformly (SDAR's random remasking);
      sequential              the quota of leftmost masked positions;
      entropy_bounded         by increasing entropy of `probs`, the longest run whose summed
                              entropy stays below `eb_threshold`, at least one (the EB-sampler;
                              no quota).
    Ties go to the leftmost position, and a greedy token tie to the lowest id, everywhere in
    the project.

    A revealed token is never the mask token. SDAR's greedy path (top-k = 1 over the whole
    vocabulary) would commit the mask token where it is the most likely one, leaving that
    position masked for good; here such a position gets its most likely other token, scored
    with the same full-vocabulary softmax (so its confidence is low)."""
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
        # SDAR splits the block evenly over the steps, the remainder going to the first steps
        base, extra = divmod(self.block_size, self.steps)
        self.quota = [base + (s < extra) for s in range(self.steps)]


    def scaled(self, logits):
        """fp32 logits / temperature: SDAR's confidence is their softmax over the whole
        vocabulary, mask token included."""
        scaled = logits.float()
        return scaled / self.temperature if self.temperature not in (0, 1) else scaled

    def no_mask(self, logits):
        """scaled, the mask token's at -inf (revealing a mask would reveal nothing)."""
        scaled = self.scaled(logits).clone()
        scaled[..., self.mask_id] = -math.inf    # (a scalar index: no host-to-device copy)
        return scaled

    def probs(self, logits):
        """(n, V) logits -> (n, V) fp32 distribution tokens are drawn from: temperature, the
        mask token removed, then top-k and top-p. A row's softmax is its own: probs(x)[rows]
        is probs(x[rows]) to the bit."""
        logits = self.no_mask(logits)
        if self.top_k is not None:
            kth = logits.topk(min(self.top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -math.inf)
        if self.top_p is not None and self.top_p < 1:
            sorted_logits, order = logits.sort(descending=True)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            drop = cum - sorted_logits.softmax(-1) >= self.top_p   # keep the smallest nucleus
            logits = logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)
        return logits.softmax(-1)

    def confidence(self, logits, tokens):
        """SDAR's confidence of (n,) tokens under (n, V) logits: their probability under the
        temperature-scaled softmax over the whole vocabulary, before top-k / top-p."""
        scaled = self.scaled(logits)                                     # (no softmax)
        return (scaled.gather(-1, tokens[:, None]).squeeze(-1) - scaled.logsumexp(-1)).exp()

    def best(self, logits):
        """(n,) each row's most likely non-mask token and its confidence, SDAR's (top-k and
        top-p never drop the most likely token)."""
        top, tokens = self.no_mask(logits).max(-1)
        return tokens, (top - self.scaled(logits).logsumexp(-1)).exp()

    def top_confidence(self, logits):
        """(n,) best's confidence alone."""
        return self.best(logits)[1]

    def pick(self, logits, generator=None, noise=None):
        """Per row of (n, V) logits: a token drawn from `probs` (greedy: the most likely one,
        `best`'s, with no softmax), and its confidence. noise: the rows' (n, V) Exp(1) draws
        (default: drawn here). -> (tokens, confidence)."""
        if self.temperature == 0:
            return self.best(logits)
        if noise is None:   # torch.multinomial's own draw (the same tokens on a CPU)
            noise = torch.empty_like(logits, dtype=torch.float).exponential_(generator=generator)
        tokens = (self.probs(logits) / noise).argmax(-1)
        return tokens, self.confidence(logits, tokens)

    def __call__(self, logits, block, step, generator=None):
        """block: (..., B) with mask_id at unknown positions; logits: (..., B, V) for every
        position of it, or packed, (M, V) for its M masked positions only, in order (what the
        decoders compute: a known position is never read); step: index of this step within
        the block. Returns the next state of the block (of every block at once, when
        batched). No host sync: every position is scored and ranked, the known ones last."""
        masked = block == self.mask_id                                  # (..., B)
        rows, packed = logits.flatten(0, -2), logits.shape[:-1] != block.shape   # (M, V)
        at = packed_index(block, self.mask_id) if packed else \
            torch.arange(block.numel(), device=block.device).view(block.shape)  # (..., B): its row
        noise = None
        if self.temperature:   # Exp(1) draws for every position, packed rows taking theirs: the
            # same tokens as from every position's logits, for the same generator
            noise = torch.empty(block.numel(), rows.shape[-1], device=rows.device).exponential_(
                generator=generator)
            noise = noise[packed_rows(block, self.mask_id, len(rows))] if packed else noise
        tokens, confidence = self.pick(rows, generator, noise)
        tokens, confidence = tokens[at], confidence[at]                 # (..., B)
        if self.strategy == "random":
            score = torch.rand(block.shape, generator=generator, device=block.device)
        elif self.strategy == "sequential":                              # leftmost first
            score = -torch.arange(block.shape[-1], device=block.device, dtype=torch.float)
            score = score.expand(block.shape)
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
        else:                                      # the step's quota of best positions
            best = order[..., :self.quota[min(step, self.steps - 1)]]
            reveal = torch.zeros_like(masked).scatter_(-1, best, True)
            if self.strategy == "low_confidence_dynamic":
                reveal |= confidence > self.threshold
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
    commit), or is written at once by its own forward (SDAR's separate commit). Both give the
    same tokens in exact arithmetic and in fp32 (tested); in bf16 the fused forward's other
    shape rounds differently, so a near-tie can differ from SDAR's loop. A block that a
    verification forward already holds as a complete copy can instead be kept from that
    forward's own keys and values (commit's copy), with copy_commit."""

    def __init__(self, model, block_size, max_len, fuse_commit=True, copy_commit=False):
        self.model, self.block_size, self.max_len = model, block_size, max_len
        self.fuse_commit, self.copy_commit = fuse_commit, copy_commit
        model.setup_cache(max_len)
        self.device = model.embed.weight.device
        self.committed, self.queries_at, self.pending, self.nfe = 0, 0, None, 0
        self.rows = Counter()   # query rows a forward -> forwards (bench.py's modelled GPU cost)

    def forward(self, tokens, pos, mask_for, keep, rows=None):
        """One forward of [pending ; tokens]. mask_for(prefix, n_commit) builds the mask_mod
        (prefix = committed rows, n_commit = rows of the pending block); -> (keep, V) logits,
        or (M, V) for `rows` (M,) of the kept rows only (a known position's logits are never
        read, and with a large vocabulary the head is most of a small model's forward)."""
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

    def prefill(self, ids):
        if len(ids):
            self.pending = ids
            self.flush()

    def commit(self, block, copy=None):
        """The finished `block` joins the cache. copy: where the last forward held it complete,
        as its copy-th block of queries after the pending rows (a verification copy a walk went
        past); with copy_commit its keys and values move into place in every layer's cache,
        which is exact: the copy attended to what the committed block attends to, the cache and
        itself, at the block's own positions. Otherwise it waits as pending rows of the next
        forward (fused commit) or is written by a forward of its own (SDAR's). Blocks are
        committed in order, so a kept row moves down before it is overwritten."""
        if copy is not None and self.copy_commit:
            if self.pending is not None:     # (it would land above the block before it)
                raise RuntimeError("a block kept from its copy after a pending one")
            B, src = self.block_size, self.queries_at + copy * self.block_size
            if src != self.committed:   # (block-aligned rows: the same rows, or apart)
                kv = self.model.kv          # every layer's keys and values: one copy
                kv[..., self.committed:self.committed + B, :] = kv[..., src:src + B, :]
            self.committed += B
            return
        self.pending = block if self.pending is None else torch.cat([self.pending, block])
        if not self.fuse_commit:
            self.flush()

    def flush(self):   # a forward with nothing but the pending rows: SDAR's commit
        self.forward(self.pending[:0], self.pending[:0], lambda c, n: masks.block_causal(
            self.block_size, c), keep=0)


def to_host(*tensors):
    """Tensors -> nested lists, with ONE host sync however many there are: each is copied
    without blocking, then the stream is waited for once. The decoders' planned host syncs
    all go through here (tests/test_syncs.py counts them)."""
    SYNCS["host"] += 1
    host = [t.to("cpu", non_blocking=True) for t in tensors]
    for device in {t.device for t in tensors if t.is_cuda}:   # the stream of each GPU copied from
        torch.cuda.current_stream(device).synchronize()
    return [h.tolist() for h in host]



def to_device(rows, device):
    """A nested list of ints -> a long tensor on `device`, without a host sync (a plain
    copy from pageable memory waits for the GPU; one from pinned memory need not)."""
    t, device = torch.tensor(rows, dtype=torch.long), torch.device(device)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t if device.type == "cpu" else t.to(device)


def check_prompt(prompt, config, max_new_tokens):
    """Check the prompt on the host (ids in the vocabulary, no mask token, room for the
    generation); -> its ids, a host list."""
    ids = prompt_list(prompt)
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


def prompt_list(prompt):
    """A prompt's ids as a host list (a tensor on a GPU: a sync a prompt)."""
    if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        return prompt
    return torch.as_tensor(prompt).flatten().tolist()


def stop_ids(config, eos_id=None):
    """The ids that end decoding: `eos_id` (one id or several) when given, else every id the
    checkpoint lists (config.stop_ids: config.json's and generation_config.json's
    eos_token_id, as SDAR's generate.py stops at each; a chat model ends its turn with
    <|im_end|>), else config.eos_token_id."""
    if eos_id is None:
        return frozenset(config.stop_ids or (config.eos_token_id,))
    return frozenset((eos_id,) if isinstance(eos_id, int) else eos_id)


@dataclass
class Frontier:
    """Where decoding stands between rounds, besides the sessions' committed caches: the open
    block. A round reads it and returns the next one; nothing else carries over."""
    block: torch.Tensor   # (B,) the open block's state, mask_id where unknown
    pos: torch.Tensor     # (B,) its positions
    n_masked: int         # how many of them are masked (on the host)
    host: list = None     # the state on the host (None before a forward read it back)
    step: int = 0         # the rule's step index within the block
    hint: tuple = ()      # what the forward that made this state said of it (Spiffy's ranks)
    context: list = ()    # the ids before the open block, on the host (round_loop's)


@dataclass
class Advance:
    """What a round did: the blocks it completed, in order, as (state, host copy, index of its
    complete copy in the round's verification forward or None), and the open block after."""
    done: list
    front: Frontier


def round_loop(round_, sessions, prompt, rule, max_new_tokens, stops, on_block=None):
    """The round loop every decoder shares (plain, SimSD, Spiffy). Prefill the prompt's whole
    blocks into each session; its tail stays in the first block as known tokens, so blocks
    stay on the grid the model was trained on. Then round after round: round_(front, room) ->
    Advance; room: the tokens max_new_tokens leaves after the open block (a round decodes no
    block past them). Every block a round completed is committed to every session (to the
    first, the verifier, from its copy where it has one), and here, in one place, decoding
    stops: at the first of the `stops` ids, at max_new_tokens, or when on_block(new ids)
    returns True (a caller's own stop, e.g. a stop string). prompt: its ids, a host list.
    -> (new ids without the stop id, why it stopped: "stop_id", "max_new_tokens", "on_block")."""
    B, mask_id, device = rule.block_size, rule.mask_id, sessions[0].device
    n_prefix = len(prompt) // B * B
    for s in sessions:
        s.prefill(to_device(prompt[:n_prefix], device))
    out, known = [], len(prompt) - n_prefix          # known: prompt tokens in the open block
    host = prompt[n_prefix:] + [mask_id] * (B - known)
    front = Frontier(to_device(host, device), torch.arange(n_prefix, n_prefix + B, device=device),
                     B - known, host)
    seen = prompt[:n_prefix]                         # the ids before the open block
    while True:
        front.context = seen
        adv = round_(front, max_new_tokens - len(out) - (B - known))
        front = adv.front
        done = adv.done + ([(front.block, front.host, None)] if not front.n_masked else [])
        for block, host, copy in done:
            for i, s in enumerate(sessions):
                s.commit(block, copy if i == 0 else None)
            new, known, seen = host[known:], 0, seen + host
            end = next((i for i, t in enumerate(new) if t in stops), len(new))
            out += new[:end]
            if on_block and on_block(new[:end]):
                return out[:max_new_tokens], "on_block"
            if end < len(new) or len(out) >= max_new_tokens:
                stopped = end < len(new) and len(out) < max_new_tokens
                return out[:max_new_tokens], "stop_id" if stopped else "max_new_tokens"
        if not front.n_masked:
            front = Frontier(torch.full_like(front.block, mask_id), front.pos + B, B, [mask_id] * B)


@torch.no_grad()
def generate(model, prompt, max_new_tokens=64, rule=None, fuse_commit=True, eos_id=None,
             generator=None, on_block=None):
    """Plain block-diffusion decoding (SDAR's block_diffusion_generate): the round loop with a
    round of one forward and one step of the rule, the reference the speculative decoders are
    tested against. model: a Transformer (batch 1). prompt: token ids. rule: a DecodeRule
    (default: the model's block size, one token per step, greedy). fuse_commit: write each
    finished block into the cache during the next block's first forward (False: SDAR's extra
    commit forward). eos_id: the stop id, or several (default: stop_ids(config)). generator:
    torch.Generator for sampling. on_block(new_ids): called as each block is finished; True
    stops decoding. Returns (new token ids without the stop id, stats with nfe, tokens,
    seconds and stop: why it ended)."""
    c = model.config
    rule = rule or DecodeRule(c.mask_token_id, c.block_size)
    ids = check_prompt(prompt, c, max_new_tokens)
    B, t0, syncs = rule.block_size, time.perf_counter(), SYNCS["host"]
    sess = Session(model, B, len(ids) + max_new_tokens + 3 * B, fuse_commit)

    def plain_round(front, room):                     # logits at the masked positions only
        logits = sess.forward(front.block, front.pos, lambda c, n: masks.block_causal(B, c), keep=B,
                              rows=packed_rows(front.block, rule.mask_id, front.n_masked))
        block = rule(logits, front.block, front.step, generator)
        host, = to_host(block)
        n_masked = host.count(rule.mask_id)
        return Advance([], Frontier(block, front.pos, n_masked, host, front.step + 1))

    stops = stop_ids(c, eos_id)
    out, stop = round_loop(plain_round, [sess], ids, rule, max_new_tokens, stops, on_block)
    return out, dict(nfe=sess.nfe, tokens=len(out), seconds=time.perf_counter() - t0, stop=stop,
                     rows=dict(sess.rows), syncs=SYNCS["host"] - syncs)
