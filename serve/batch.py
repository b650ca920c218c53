"""Many prompts decoded together, each exactly as it decodes alone (docs/design.md, section 8).

The decoders stay the single-request reference: each request runs the unchanged decoder in a
thread of its own, given `Slot`s, stand-ins for the models. A Slot's forward does not run: it
parks the request and hands the forward to `decode_all`, which lets one request run at a time
(a thread here is a stack that waits, never a second worker) until every live one is parked,
then runs ONE forward of each model for all the requests waiting on it, and resumes them. A
batch of one needs no thread: its forwards run at once, in the caller's.

That forward packs the requests' query rows into one sequence (no padding). Each request owns
a slot of the model's KV cache, rows [slot x L, (slot + 1) x L); its queries are written at
its own cursor and see only its own slot, through its own mask, so a row's logits are the ones
its solo forward computes: on this CPU bit for bit (rows_keep_their_bits; tests/test_batch.py).
With static shapes (CUDA graphs) a forward is instead ONE attention call over the whole cache,
padded to a bucket (Pool.bucketed): the logits to rounding, not to the bit.
"""
import functools
import sys
import threading
from collections import Counter, namedtuple

import torch
from tqdm import tqdm

import mask as masks
from decode import to_device
from fast import many_graphs

# A parked forward, as decode.Session makes it: the request's Slot, its (T,) token ids and
# positions, its cache cursor, its mask_mod, and which logits it keeps (model.forward's keep, rows)
Call = namedtuple("Call", "slot idx pos start mask keep rows")


class Slot:
    """What decode.Session reads of a model (config, embed, setup_cache, kv, a forward), for one
    request: its rows of the model's cache, and forwards that park the request (`Request`)."""

    def __init__(self, model, pool, index, request):
        self.model, self.pool, self.index, self.request = model, pool, index, request
        self.config, self.embed = model.config, model.embed

    def setup_cache(self, max_len, batch=1):   # (a slot holds one sequence)
        self.pool.reserve(max_len)

    @property
    def kv(self):   # this request's rows of every layer's keys and values
        L = self.pool.slot_len
        return self.model.kv[..., self.index * L:(self.index + 1) * L, :]

    def __call__(self, idx, pos, start, mask, keep=None, rows=None):   # (no request: a batch of one)
        call = Call(self, idx[0], pos, start, mask, keep, rows)
        return self.pool.forward([call])[0] if self.request is None else self.request.park(call)


@functools.cache
def static_trunk(cls, cuda):
    """The trunk of bucketed forwards, compiled as fast.compile_static compiles (CUDA graphs on
    CUDA): once a process, so that every batch finds the graphs already built. A graph a bucket
    and cache length (a cache grows by powers of two), so more than a solo run's: up to 256."""
    options = dict(mode="reduce-overhead") if cuda else {}
    return many_graphs(torch.compile(cls.trunk, dynamic=False, **options), 256)


class Pool:
    """One model's cache as n slots of `slot_len` rows each (a power of two), grown on demand;
    the forwards it ran, by their query rows (packed; bucketed ones padded). A model with static
    shapes (fast.py's compile_static installed its forward) runs a batch's forwards bucketed."""

    def __init__(self, model, n):
        self.model, self.n, self.slot_len = model, n, 0
        self.forwards, self.query_rows = 0, Counter()
        self.buckets = Counter()   # bucketed's forwards, by rows padded
        static = "forward" in vars(model)
        self.trunk = static_trunk(type(model), model.embed.weight.is_cuda) if static else None

    def slot_bytes(self):
        """A slot's KV cache: rows x layers x (k, v) x KV heads x head size x the dtype's bytes."""
        if not self.slot_len:   # no request reserved a slot (a drafter that never ran)
            return 0
        return self.slot_len * self.model.kv[..., :1, :].nbytes

    def reserve(self, max_len, spare=0):
        """Room for max_len rows a slot and `spare` rows past the slots (static shapes' padding
        rows): a bigger cache, every slot's rows copied over. The first keeps the model's cache
        if it has room (its tensor, and so a CUDA graph's address, as another batch left it)."""
        L = max(self.slot_len, 256, 1 << (max_len - 1).bit_length())
        if L == self.slot_len and self.model.kv.shape[-2] >= self.n * L + spare:
            return
        old, was = self.model.kv, self.slot_len
        if was:   # (else the cache holds no slot yet: kept if it has room)
            self.model.kv = None
        self.model.setup_cache(self.n * L + spare)
        for i in range(self.n if was else 0):
            self.model.kv[..., i * L:i * L + was, :] = old[..., i * was:(i + 1) * was, :]
        self.slot_len = L

    @torch.no_grad()
    def forward(self, calls):
        """ONE forward of the Calls' queries -> each call's logits, as model.forward gives them.
        With static shapes, a prompt's prefill (any length: start 0) runs packed, eager, as
        fast.static_shapes runs it alone: a step is then two forwards."""
        if self.trunk is None or all(c.start == 0 for c in calls):
            return self.packed(calls)
        first, rest = [c for c in calls if c.start == 0], [c for c in calls if c.start]
        out = dict(zip(map(id, first), self.packed(first) if first else ()))
        out |= zip(map(id, rest), self.bucketed(rest))
        return [out[id(c)] for c in calls]

    def packed(self, calls):
        """The Calls' queries packed (no padding): attention and the head run per request, the
        shapes of its solo forward (so, on this CPU, its bits)."""
        model, L, device = self.model, self.slot_len, self.model.embed.weight.device
        build = masks.block_mask if model.attn_impl == "flex" else masks.dense_mask
        parts, written, at = [], [], 0
        for c in calls:   # each its own rows, keys and mask
            T, base = len(c.idx), c.slot.index * L
            parts.append((slice(at, at + T), slice(base, base + c.start + T),
                          build(c.mask, T, c.start + T, device)))
            written += range(base + c.start, base + c.start + T)
            at += T
        x = model.trunk(torch.cat([c.idx for c in calls])[None], torch.cat([c.pos for c in calls]),
                        to_device(written, device), parts)
        return self.heads(calls, x, at)

    def bucketed(self, calls):
        """Static shapes: ONE trunk call, ONE attention call a layer, for every request. The
        packed queries are padded to `size` rows (a power of two: the bucket), the keys are the
        whole cache, and which query sees which key is evaluated here into a (size, keys + 1)
        table: each request's own mask over its own slot (block-diagonal by request); a padding
        query writes a row past the slots and sees only it. One graph a bucket, whatever the mix
        of requests and masks. Not a request's solo call: on a GPU, an agreement rate."""
        model, L, device = self.model, self.slot_len, self.model.embed.weight.device
        R = sum(len(c.idx) for c in calls)
        size = max(4, 1 << (R - 1).bit_length())
        self.reserve(L, spare=size - R)
        self.buckets[size] += 1
        K = model.kv.shape[-2]
        seen = torch.zeros(size, K + 1, dtype=torch.bool, device=device)   # column K: never seen
        written, at = [], 0
        for c in calls:
            T, base = len(c.idx), c.slot.index * L
            keys = c.start + T   # its solo forward's: its slot's rows [0, start + T)
            seen[at:at + T, base:base + keys] = masks.dense_mask(c.mask, T, keys, device)
            written += range(base + c.start, base + c.start + T)
            at += T
        written += range(self.n * L, self.n * L + size - R)       # the padding rows' own keys
        written = to_device(written, device)
        seen[torch.arange(R, size, device=device), written[R:]] = True

        def visible(b, h, q_idx, kv_idx):   # one lookup (docs/torch_bugs/flex_cpu_vecmask_mix.py)
            return seen[q_idx.clamp(0, size - 1), kv_idx.clamp(0, K)]
        pad = lambda x: torch.nn.functional.pad(x, (0, size - R))
        x = self.trunk(model, pad(torch.cat([c.idx for c in calls]))[None],
                       pad(torch.cat([c.pos for c in calls])), written, visible)
        return self.heads(calls, x, size)

    def heads(self, calls, x, rows):
        """Each request's kept rows of the trunk's output x through the head, on its own."""
        self.forwards += 1
        self.query_rows[rows] += 1
        out, end = [], 0
        for c in calls:
            end += len(c.idx)
            xi = x[:, end - (len(c.idx) if c.keep is None else c.keep):end]
            out.append(self.model.head(xi if c.rows is None else xi[:, c.rows]))
        return out


def rows_keep_their_bits():
    """Whether a row's product with a weight matrix has the same bits in a product of 4, 8, 12,
    16 or 32 rows (every forward holds whole blocks) as in one of 256, on this machine's CPU:
    what batched decoding's bit-for-bit equality with solo decoding rests on (MKL on an AMD
    EPYC: yes, but not at 1-3, 5-7 or 9-11 rows). Where not, a batch promises an agreement rate."""
    g = torch.Generator().manual_seed(0)
    for n, k in ((2048, 256), (768, 256), (256, 768), (256, 256)):
        w, x = torch.randn(n, k, generator=g), torch.randn(1, 256, k, generator=g)
        full = torch.nn.functional.linear(x, w)
        if not all(torch.equal(torch.nn.functional.linear(x[:, :m], w), full[:, :m]) for m in (4, 8, 12, 16, 32)):
            return False
    return True


class Request:
    """One prompt's decoding in a thread that runs only while decode_all waits for it: a
    coroutine whose yield is a model's forward (park)."""

    def __init__(self, index, decode):
        self.index, self.done, self.result, self.error, self.call = index, False, None, None, None
        self.reply = None
        self._go, self._parked = threading.Semaphore(0), threading.Semaphore(0)
        self.thread = threading.Thread(target=self._run, args=(decode,), daemon=True)
        self.thread.start()

    def _run(self, decode):
        """The request's ops run on one torch thread: a team of more would spin on the cores that
        decode_all's forward needs (experiments/batch_threads.py). (This also sets the count a
        new thread starts with: decode_all puts that back.)"""
        torch.set_num_threads(1)
        self._go.acquire()
        try:
            self.result = decode(self)
        except BaseException as e:  # noqa: B036  re-raised by decode_all, in its thread
            self.error = e
        self.done, self.call = True, None
        self._parked.release()

    def resume(self, reply=None):
        """From decode_all: run until the next forward (-> its Call) or the end (-> None)."""
        self.reply = reply
        self._go.release()
        self._parked.acquire()
        return self.call

    def park(self, call):
        """From the request's thread: hand the forward over, wait for its logits."""
        self.call = call
        self._parked.release()
        self._go.acquire()
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply


class Abandoned(BaseException):
    """Thrown into a parked request when decode_all stops early (a BaseException, like
    GeneratorExit: a decoder's `except Exception` does not swallow it)."""


def decode_all(decode, prompts, models, n_slots, progress=False):
    """decode(i, prompt, *slots) -> a result: prompt i decoded alone, on models given as Slots
    (None stays None). At most n_slots requests live at a time; a finished one's slot takes the
    next prompt, whose prefill joins the next forward of its model. A step runs one forward of
    each model (in `models`' order) that some request waits on. -> ([a result a prompt, in
    order], [each model's Pool, or None]: its forwards and rows). Each request must draw from
    its own generator (a sampled decode without one draws from torch's global stream).
    progress: a bar of the prompts done, on stderr (where it is a terminal)."""
    if n_slots < 1:
        raise ValueError(f"--batch must be >= 1, got {n_slots}")
    n_slots = min(n_slots, len(prompts))
    pools = [m and Pool(m, n_slots) for m in models]
    with tqdm(total=len(prompts), desc="prompts", unit="prompt", file=sys.stderr,
              disable=None if progress else True) as bar:   # (None: off where stderr is no terminal)
        if n_slots > 1:
            return together(decode, prompts, models, pools, n_slots, bar), pools
        slots, results = [pool and Slot(m, pool, 0, None) for m, pool in zip(models, pools)], []
        for i, prompt in enumerate(prompts):   # a batch of one: no thread, its forwards run at once
            results.append(decode(i, prompt, *slots))
            bar.update()
        return results, pools


def together(decode, prompts, models, pools, n_slots, bar):
    """decode_all's batch: a Request a live prompt, parked at each forward; a step runs ONE
    forward of each model for the requests waiting on it and resumes them. -> the results."""
    todo, results, live, calls = iter(enumerate(prompts)), [None] * len(prompts), {}, {}
    threads = torch.get_num_threads()   # (a new thread's count, which Request._run sets, put back)

    def fill(s):   # the next prompt, if any, into slot s
        if (job := next(todo, None)) is not None:
            i, prompt = job
            live[s] = Request(i, lambda r: decode(i, prompt, *(
                pool and Slot(m, pool, s, r) for m, pool in zip(models, pools))))

    def run(s, reply=None):   # slot s's request on to its next forward (a finished one replaced)
        while s in live:
            r = live[s]
            call = r.resume(reply)
            if call is not None:
                calls[s] = call
                return
            del live[s]
            if r.error is not None:
                raise r.error
            results[r.index], reply = r.result, None
            bar.update()
            fill(s)
    try:
        for s in range(n_slots):
            fill(s)
            run(s)
        while calls:
            for pool in filter(None, pools):
                group = sorted(s for s, call in calls.items() if call.slot.pool is pool)
                for s, logits in zip(group, pool.forward([calls.pop(s) for s in group]) if group else ()):
                    run(s, logits)
    finally:
        for r in live.values():
            if not r.done:
                r.resume(Abandoned())
        torch.set_num_threads(threads)
    return results
