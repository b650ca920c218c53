"""Tensor parallelism: the target split over N processes (torchrun), every decoder unchanged.

    torchrun --nproc-per-node 2 sample.py --spec simsd       # 2 ranks: gloo on a CPU, NCCL on GPUs

What rank r of N holds (gpt-fast's plan; model.py stays single-device):

    attention   heads and KV heads [r/N, (r+1)/N): wq, wk, wv by rows, wo by columns, its KV cache
    MLP         gate and up by rows, down by columns          (SwiGLU is elementwise: no exchange)
    experts     experts [r E/N, (r+1) E/N) whole; the router whole, so every rank routes alike
    the rest    embedding, norms and head whole: every rank computes the same logits

After attention and after the MLP one all-reduce sums the ranks' partial outputs: two a layer. The
drafter is not split; every rank runs it whole. Every decision (the walk, the cuts, the gate, the
random draws) is then taken from the same bits on every rank; ranks that diverged would call
collectives of different shapes, so the process group times out (TIMEOUT_S) rather than hangs,
and PARALLEL_CHECK=1 compares every forward's query tokens across ranks before it runs.
"""
import hashlib
import os
import sys
import traceback
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from loading import util
from model import SparseMLP

TIMEOUT_S = 600     # a collective that waits longer: an error (a rank left, or the ranks diverged)
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))   # torchrun's


def run(main):
    """util.run(main), under torchrun on every rank (ranks)."""
    return util.run(main) if WORLD == 1 else ranks(main)


def ranks(main):
    """util.run(main) on this rank: only rank 0 prints (its bad-input line too: every rank meets
    the same, or agree gathers it); every rank exits. Another rank's traceback still shows."""
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=TIMEOUT_S))
    if RANK:   # (progress bars too; an uncaught exception still reaches the terminal)
        sys.stdout = sys.stderr = open(os.devnull, "w")
        sys.excepthook = lambda *e: traceback.print_exception(*e, file=sys.__stderr__)
    try:
        return util.run(main)
    finally:
        dist.destroy_process_group()


def device(name):
    """This rank's device: under torchrun, --device cuda is the LOCAL_RANK-th GPU (gpu)."""
    return gpu(name) if WORLD > 1 and torch.device(name).type == "cuda" else name


def gpu(name):
    """--device cuda under torchrun: each rank's own GPU, the LOCAL_RANK-th (set as the current one)."""
    local, n = int(os.environ.get("LOCAL_RANK", RANK)), int(os.environ.get("LOCAL_WORLD_SIZE", WORLD))
    if torch.device(name).index is not None or torch.cuda.device_count() < n:
        raise ValueError(f"--device {name} with {n} ranks here: give --device cuda, with a GPU a rank "
                         f"({torch.cuda.device_count()} here)")
    torch.cuda.set_device(local)
    return f"cuda:{local}"


def agree(load):
    """load(), under torchrun on every rank, failing on all if it fails on any (agreed)."""
    return load() if WORLD == 1 else agreed(load)


def agreed(load):
    """load() on this rank; a failure on any rank fails every rank with its message (rank 0
    prints it), so that no rank waits in a collective for one that left."""
    try:
        out, error = load(), None
    except Exception as e:   # (ValueError, OSError: bad input; another, an out-of-memory, by its name)
        out, error = None, str(e) if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {e}"
    errors = [None] * WORLD
    dist.all_gather_object(errors, error, group=control())
    if any(e is not None for e in errors):   # (the rank named where the ranks differ)
        r = next(r for r, e in enumerate(errors) if e is not None)
        raise ValueError(errors[r] if len(set(errors)) == 1 else f"rank {r}: {errors[r]}")
    return out


def control():
    """A gloo group for host values (errors, checks), on a CPU whatever the device."""
    global _CONTROL
    if "_CONTROL" not in globals():
        _CONTROL = dist.new_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT_S))
    return _CONTROL


def shard(model):
    """from_pretrained's split: under torchrun the meta model cut to this rank's shapes -> take."""
    return split(model, RANK, WORLD) and take if WORLD > 1 else None   # (split returns the model)


def take(name, weight):
    """A checkpoint tensor (our name) as read -> this rank's part: a split weight's slice (wo and
    down by columns, the rest by rows), else the whole (the shape check then refuses a bad one)."""
    dim = 1 if name.endswith(("attn.wo.weight", "mlp.down.weight")) else 0
    return part(weight, dim, RANK, WORLD) if is_split(name) and weight.dim() == 2 else weight


def split(model, rank, n, reduce=True):
    """Rank `rank` of `n`'s part of `model`'s weights; with `reduce`, its all-reduces (the hook
    handles in model.all_reduces). config's head counts become this rank's, so Attention's views
    and setup_cache need no change."""
    c = model.config
    check(c, n)
    for layer in model.layers:
        a, m = layer.attn, layer.mlp
        for lin, dim in ((a.wq, 0), (a.wk, 0), (a.wv, 0), (a.wo, 1)) + (() if isinstance(m, SparseMLP) else (
                (m.gate, 0), (m.up, 0), (m.down, 1))):
            lin.weight = torch.nn.Parameter(part(lin.weight, dim, rank, n))
        a.n_head, a.n_kv_head = c.n_head // n, c.n_kv_head // n
        if isinstance(m, SparseMLP):   # whole experts: a rank sums the routed outputs of its own
            m.gate, m.up, m.down = (torch.nn.Parameter(part(p, 0, rank, n)) for p in (m.gate, m.up, m.down))
            m.__class__, m.first = RankExperts, rank * c.n_experts // n   # (the same module, its own experts)
    model.config = replace(c, n_head=c.n_head // n, n_kv_head=c.n_kv_head // n)
    model.all_reduces = [mod.register_forward_hook(summed) for layer in model.layers
                         for mod in (layer.attn, layer.mlp)] if reduce else []
    if os.environ.get("PARALLEL_CHECK"):
        model.embed.register_forward_pre_hook(same_queries)
    return model


def is_split(name):
    """Whether parameter `name` is divided over the ranks (else every rank holds it whole)."""
    return (".attn.w" in name or ".mlp." in name) and ".router" not in name


class RankExperts(SparseMLP):
    """A SparseMLP that holds experts [first, first + E/N): routed as the whole one (its router is
    whole), it adds the outputs of its own experts only; the all-reduce adds the other ranks'."""

    def local(self, experts, weights):
        """Global expert ids -> this rank's (-1 and weight 0 for another rank's)."""
        e = experts - self.first
        mine = (e >= 0) & (e < self.gate.shape[0])
        return torch.where(mine, e, -1), weights * mine

    def by_row(self, x, experts, weights):   # compiled: every slot, another rank's at weight 0
        return super().by_row(x, *self.local(experts, weights))

    def by_expert(self, x, experts, w):      # eager: this rank's experts only, one at a time
        experts, w = self.local(experts, w)
        out = torch.zeros_like(x)
        for rows, j in (torch.where(experts == e) for e in experts.unique().tolist() if e >= 0):
            out.index_add_(0, rows, super().by_row(x[rows], experts[rows, j, None], w[rows, j, None]))
        return out


def check(c, n):
    """Refuse a split the shapes do not allow, naming config.json's key."""
    dense = not c.n_experts or c.decoder_sparse_step > 1 or c.mlp_only_layers
    for key, size in (("num_attention_heads", c.n_head), ("num_key_value_heads", c.n_kv_head),
                      ("intermediate_size", c.intermediate_size if dense else n),
                      ("num_experts", c.n_experts or n)):
        if size % n:
            raise ValueError(f"{n} ranks cannot split the target: its {key} {size} is not a multiple of {n}")


def part(weight, dim, rank, n):
    """Slice `rank` of `n` equal ones along `dim`, a tensor of its own (the whole one is freed)."""
    return weight.detach().chunk(n, dim)[rank].clone()


def summed(module, inputs, out):
    """Forward hook: the ranks' partial outputs, summed (one all-reduce)."""
    return funcol.all_reduce(out, "sum", dist.group.WORLD)


@torch.compiler.disable   # (a host exchange: outside any compiled graph)
def same_queries(module, inputs):
    """PARALLEL_CHECK=1: before a forward, every rank must send the same query tokens."""
    digest = hashlib.sha1(inputs[0].cpu().numpy().tobytes() + str(tuple(inputs[0].shape)).encode()).hexdigest()
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, digest, group=control())
    if len(set(seen)) > 1:
        raise RuntimeError(f"the ranks diverged: rank {RANK}'s query tokens differ from another rank's")


def weight_bytes(model):
    """This rank's weight bytes (a tied head counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def describe(model):
    """For --json: the ranks and each rank's weight bytes (a collective: every rank calls it)."""
    every = [weight_bytes(model)] * WORLD
    if WORLD > 1:
        dist.all_gather_object(every, every[0], group=control())
    return dict(ranks=WORLD, rank_weight_bytes=every)
