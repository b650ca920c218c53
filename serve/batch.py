"""Many prompts decoded together, each exactly as it decodes alone (docs/design.md, section 8).

The decoders stay the single-request reference: each request runs the unchanged decoder in a
thread of its own, given `Slot`s, stand-ins for the models. A Slot's forward does not run: it
parks the request and hands the forward to `decode_all`, which lets one request run at a time
(a thread here is a stack that waits, never a second worker) until every live one is parked,
then runs ONE forward of each model for all the requests waiting on it, and resumes them.

That forward packs the requests' query rows into one sequence (no padding). Each request owns
a slot of the model's KV cache, rows [slot x L, (slot + 1) x L); its queries are written at
its own cursor and see only its own slot, through its own mask, so a row's logits are the ones
its solo forward computes. On a CPU, bit for bit (tests/test_batch.py).
"""
import threading
from collections import Counter

import torch

import mask as masks
from decode import to_device


class Slot:
    """What decode.Session reads of a model (config, embed, setup_cache, kv, a forward), for one
    request: its rows of the model's cache, and forwards that park the request (`Request`)."""

    def __init__(self, model, pool, index, request):
        self.model, self.pool, self.index, self.request = model, pool, index, request
        self.config, self.embed = model.config, model.embed

    def setup_cache(self, max_len, batch=1):
        self.pool.reserve(max_len)

    @property
    def kv(self):   # this request's rows of every layer's keys and values
        L = self.pool.rows
        return self.model.kv[..., self.index * L:(self.index + 1) * L, :]

    def __call__(self, idx, pos, start, mask, keep=None, rows=None):
        return self.request.park((self, idx[0], pos, start, mask, keep, rows))


class Pool:
    """One model's cache as n slots of `rows` rows each (a power of two), grown on demand."""

    def __init__(self, model, n):
        self.model, self.n, self.rows = model, n, 0
        self.forwards, self.query_rows = 0, Counter()   # forwards by their packed rows

    def slot_bytes(self):
        """A slot's KV cache: rows x layers x (k, v) x KV heads x head size x the dtype's bytes."""
        return self.rows * self.model.kv[..., :1, :].nbytes

    def reserve(self, max_len):
        """Room for max_len rows a slot: a bigger cache, every slot's rows copied over."""
        rows = max(256, 1 << (max_len - 1).bit_length())
        if rows <= self.rows:
            return
        old, L = self.model.kv, self.rows
        self.model.kv = None
        self.model.setup_cache(self.n * rows)
        for i in range(self.n if L else 0):
            self.model.kv[..., i * rows:i * rows + L, :] = old[..., i * L:(i + 1) * L, :]
        self.rows = rows

    @torch.no_grad()
    def forward(self, calls):
        """ONE forward of the calls' queries, packed: [(slot, idx, pos, start, mask_mod, keep,
        rows)] as Session.forward makes them -> each call's logits, as model.forward gives."""
        model, L, device = self.model, self.rows, self.model.embed.weight.device
        build = masks.block_mask if model.attn_impl == "flex" else masks.dense_mask
        parts, written, end = [], [], 0
        for slot, idx, _, start, mask_mod, *_ in calls:   # each its own rows, keys and mask
            T, base = len(idx), slot.index * L
            parts.append((slice(end, end + T), slice(base, base + start + T),
                          build(mask_mod, T, start + T, device)))
            written += range(base + start, base + start + T)
            end += T
        x = model.trunk(torch.cat([c[1] for c in calls])[None], torch.cat([c[2] for c in calls]),
                        to_device(written, device), parts)
        self.forwards += 1
        self.query_rows[end] += 1
        out = []
        for (slot, idx, _, _, _, keep, rows), (queries, *_) in zip(calls, parts):
            end = queries.stop
            xi = x[:, end - (len(idx) if keep is None else keep):end]
            out.append(model.head(xi if rows is None else xi[:, rows]))
        return out


class Request:
    """One prompt's decoding in a thread that runs only while decode_all waits for it: a
    coroutine whose yield is a model's forward (park)."""

    def __init__(self, index, decode):
        self.index, self.done, self.result, self.error, self.call = index, False, None, None, None
        self._go, self._parked = threading.Semaphore(0), threading.Semaphore(0)
        self.thread = threading.Thread(target=self._run, args=(decode,), daemon=True)
        self.thread.start()

    def _run(self, decode):
        self._go.acquire()
        try:
            self.result = decode(self)
        except BaseException as e:  # noqa: B036  re-raised by decode_all, in its thread
            self.error = e
        self.done, self.call = True, None
        self._parked.release()

    def resume(self, reply=None):
        """From decode_all: run until the next forward (-> its call) or the end (-> None)."""
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


class Abandoned(Exception):
    """Thrown into a parked request when decode_all stops early."""


def decode_all(decode, prompts, models, n_slots):
    """decode(i, prompt, *slots) -> a result: prompt i decoded alone, on models given as Slots
    (None stays None). At most n_slots requests live at a time; a finished one's slot takes the
    next prompt, whose prefill joins the next forward of its model. A step runs one forward of
    each model (in `models`' order) that some request waits on. -> ([result a prompt, in
    order], {model index: its Pool}: forwards and rows)."""
    if n_slots < 1:
        raise ValueError(f"--batch must be >= 1, got {n_slots}")
    n_slots = min(n_slots, len(prompts))
    pools = [m and Pool(m, n_slots) for m in models]
    todo, results, live, calls = iter(enumerate(prompts)), [None] * len(prompts), {}, {}

    def start(s):   # the next prompt into slot s, run to its first forward
        for i, prompt in todo:
            live[s] = Request(i, lambda r, i=i, p=prompt: decode(i, p, *(
                pool and Slot(m, pool, s, r) for m, pool in zip(models, pools))))
            if advance(s):
                return

    def advance(s, reply=None):   # -> whether slot s now waits on a forward
        r = live[s]
        call = r.resume(reply)
        if call is None:
            del live[s]
            if r.error is not None:
                raise r.error
            results[r.index] = r.result
            start(s)
            return s in live
        calls[s] = call
        return True
    try:
        for s in range(n_slots):
            start(s)
        while calls:
            for pool in filter(None, pools):
                group = sorted(s for s, call in calls.items() if call[0].pool is pool)
                if group:
                    for s, logits in zip(group, pool.forward([calls.pop(s) for s in group])):
                        advance(s, logits)
    finally:
        for r in live.values():
            if not r.done:
                r.resume(Abandoned())
    return results, pools
