"""Where compiled decoding parts from eager, one forward at a time.

The compiled model runs in lockstep with an eager twin (the same weights, a cache of its own):
before each forward the twin's cache is set to the compiled model's, both run on the same
inputs, the logits and the cache rows written are compared, and then the compiled model takes
the twin's rows and decoding goes on from the twin's logits. So every forward is compared on
identical inputs, and one wrong forward cannot make the ones after it wrong.

For each configuration it prints the first forward that differs: its model, start row and
query rows; the graph it ran (dynamic shapes: the mask kind, and start == 0 or > 0; static
shapes: the padded bucket, the prefill being eager); which call of that graph it was (with
CUDA graphs, 1 is the warm-up, 2 the record, 3 and on replays); whether its row count was the
graph's first; and the first layer whose cache rows differ. A configuration that differs is
run again with the cache zeroed before each prompt, which says whether old rows matter. Then
the compiled models decode free-running, every stale cache row filled with garbage
(stale_garbage), and the decoders that write other tokens than eager are named. Exit status
1 if any configuration differs or fails to compile.

The decoders (`decoders`: plain, threshold, SimSD with the drafter, trajectory and lookup,
lossless and temporal, and Spiffy) run on the embedded pair at one block size, in fp32.
Configurations, most telling first; CUDA-only ones are skipped on a CPU, and past --budget
seconds the rest are skipped:

  eager-flex       no compile: FlexAttention, against SDPA
  dyn-flex         compile_dynamic, FlexAttention
  static-flex-cg   compile_static, FlexAttention, CUDA graphs (the bench's GPU rows)
  static-flex      compile_static, FlexAttention, no CUDA graphs
  dyn-sdpa         compile_dynamic, SDPA
  dyn-flex-main    compile_dynamic, FlexAttention forced onto its main kernel (CUDA)
  static-sdpa-cg   compile_static, SDPA, CUDA graphs
  static-cg-aot    compile_static, CUDA graphs without inductor (backend "cudagraphs")

    python tools/lockstep.py                           # every configuration this machine has
    python tools/lockstep.py --configs dyn-flex --budget 150 --device cuda
    python tools/lockstep.py --backend aot_eager       # a dry run of the flow, in seconds
"""
import copy
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import fast  # noqa: E402
import verify  # noqa: E402
import model as model_module  # noqa: E402
from measure.graphs import graph_path, load_graph  # noqa: E402
from cli import DEFAULT_DRAFTER, DEFAULT_TARGET, load, make_rule  # noqa: E402
from measure.pricing import default_rows  # noqa: E402
import variants  # noqa: E402
from decode import DecodeRule, generate  # noqa: E402
from sample import DEFAULT_PROMPT  # noqa: E402
from spiffy import spiffy_generate  # noqa: E402
from loading.util import ArgumentParser  # noqa: E402

# (not eager-flex: it needs torch.compile on, and tests/test_scripts.py runs with it off)
SMOKE = "--configs dyn-sdpa --block-size 4 --device cpu --backend aot_eager"
SMOKE_OUTPUT = r"dyn-sdpa: \d+ forwards, 0 differ(.|\n)*8 of 8 decoders write eager's tokens"

MAIN_KERNEL = {"FORCE_USE_FLEX_ATTENTION": True}   # flex's options, dyn-flex-main's
TOL = 1e-4   # fp32: a compiled kernel may sum in another order, never by this much
PROMPTS = (DEFAULT_PROMPT, "Question: What is 7 times 8?\nAnswer:")
CONFIGS = {   # name: (attention, shapes, torch.compile options, needs CUDA)
    "eager-flex": ("flex", None, {}, False),
    "dyn-flex": ("flex", "dynamic", {}, False),
    "static-flex-cg": ("flex", "static", dict(mode="reduce-overhead"), True),
    "static-flex": ("flex", "static", {}, False),
    "dyn-sdpa": ("sdpa", "dynamic", {}, False),
    "dyn-flex-main": ("flex", "dynamic", {}, True),
    "static-sdpa-cg": ("sdpa", "static", dict(mode="reduce-overhead"), True),
    "static-cg-aot": ("flex", "static", dict(backend="cudagraphs"), True),
}


def diff(a, b):
    return (a - b).abs().max().item() if a.numel() else 0.0


class Lockstep:
    """Runs `compiled`'s forwards in lockstep with `twin` (see the module's docstring) and logs
    each: {n, model, start, rows, graph, call, first, logits, cache, layer}. inject: (graph,
    call) whose compiled logits get +1, a planted fault (the tool's own test)."""

    def __init__(self, name, compiled, twin, static, log, inject=None):
        self.name, self.twin, self.static, self.log, self.inject = name, twin, static, log, inject
        self.calls, self.first_rows = Counter(), {}
        self.compiled, self.inner = compiled, compiled.forward   # what the compiler installed
        self.own = vars(compiled).get("forward")
        compiled.forward = self.forward

    def release(self):
        """The compiled model as it was before."""
        if self.own is None:
            del self.compiled.forward
        else:
            self.compiled.forward = self.own

    def graph(self, start, T, mask):
        kind = getattr(mask, "__name__", "block_causal_mask").removesuffix("_mask")
        if self.static:
            return "prefill (eager)" if not start else f"bucket {1 << (T - 1).bit_length()}"
        return f"{kind}, start {'== 0' if not start else '> 0'}"

    def forward(self, idx, pos=None, start=None, mask=None, keep=None, rows=None):
        m, twin, T = self.compiled, self.twin, idx.shape[1]
        if twin.kv is None or twin.kv.shape != m.kv.shape:
            twin.setup_cache(m.kv.shape[4])
        twin.kv.copy_(m.kv)                               # the same inputs, old rows included
        ref = twin(idx, pos, start, mask, keep, rows)
        out = self.inner(idx, pos, start, mask, keep, rows)
        key = self.graph(start, T, mask)
        self.calls[key] += 1
        self.first_rows.setdefault(key, T)
        if self.inject == (key, self.calls[key]):
            out = out + 1
        end = (start or 0) + T                            # rows [0, end) are this forward's
        layers = [diff(m.kv[i, ..., :end, :], twin.kv[i, ..., :end, :]) for i in range(len(m.kv))]
        self.log.append(dict(n=len(self.log), model=self.name, start=start or 0, rows=T, graph=key,
                             call=self.calls[key], first=T == self.first_rows[key],
                             logits=diff(out, ref), cache=max(layers),
                             layer=next((i for i, d in enumerate(layers) if d > TOL), None)))
        m.kv[..., :end, :] = twin.kv[..., :end, :]        # teacher-forced: go on from eager's
        return ref


def decoders(target, drafter, rule, graph, n):
    """name -> decode(prompt ids) -> n new ids: every decoder, with `rule` (a threshold rule)
    and the one-token-a-step rule, as the command lines run them on a GPU (verify.walk_one_sync, the
    copies cut to the rows a static-shape graph holds; fast.draft_one_sync); SimSD's drafter-free references need no
    drafter, and Spiffy's `graph` is calibrated for `rule`."""
    plain, B = DecodeRule(rule.mask_id, rule.block_size), rule.block_size
    fast_path = dict(walk=verify.walk_one_sync, cut=fast.cutter(None, default_rows(None, "cuda", "static", B), B))

    def simsd(p, **kw):
        lossless = kw.get("verifier") != "temporal"
        return variants.simsd(target, None if "reference" in kw else drafter, p, n, rule,
                              eos_id=-1, draft=fast.draft_one_sync, **kw, **fast_path if lossless else {})[0]
    return {"plain": lambda p: generate(target, p, n, plain, eos_id=-1)[0],
            "threshold": lambda p: generate(target, p, n, rule, eos_id=-1)[0],
            "simsd": lambda p: simsd(p),
            "simsd-temporal": lambda p: simsd(p, verifier="temporal", acceptance="paper"),
            "simsd-trajectory": lambda p: simsd(p, reference="trajectory"),
            "simsd-lookup": lambda p: simsd(p, reference="lookup"),
            "simsd-lookup-temporal": lambda p: simsd(p, reference="lookup", verifier="temporal",
                                                     acceptance="paper"),
            "spiffy": lambda p: spiffy_generate(target, p, n, rule, graph, eos_id=-1,
                                                **fast_path)[0]}


def stale_garbage(model, seed=0):
    """From now on, every cache row of `model` that is neither committed nor written by the
    coming forward holds large finite garbage: filled at allocation and before each forward
    (so before each prompt too). Masked attention gives such a row weight 0, which stays 0
    only while the row is finite (0 x NaN is NaN). With it, tokens that change are a leak."""
    setup, inner = model.setup_cache, model.forward
    g = torch.Generator(model.embed.weight.device).manual_seed(seed)

    def fill(start):                                   # rows [0, start) are committed
        rows = model.kv[..., start:, :]
        rows.copy_(100 * torch.randn(rows.shape, generator=g, device=rows.device, dtype=rows.dtype))

    def setup_cache(max_len, batch=1):
        old = model.kv
        setup(max_len, batch)
        if model.kv is not old:
            fill(0)

    def forward(idx, pos=None, start=None, mask=None, keep=None, rows=None):
        if start is not None:
            fill(start)
        return inner(idx, pos, start, mask, keep, rows)
    model.setup_cache, model.forward = setup_cache, forward


def compiled(config, models, backend=None):
    """Fresh copies of `models` with the configuration's attention, compiled as it says."""
    attn, shapes, options, _ = CONFIGS[config]
    torch._dynamo.reset()
    out = []
    for base in models:
        m = copy.deepcopy(base)
        m.attn_impl = attn
        if shapes:
            how = fast.compile_static if shapes == "static" else fast.compile_dynamic
            how(m, **(options or dict(backend=backend or "inductor")))
        out.append(m)
    return out


def run(config, models, runs, prompts, zeroed=False, inject=None):
    """The compiled `models` (target, drafter) each in lockstep with an eager twin, through
    every decoder of `runs` (decoders' names) and prompt. -> the forwards' log."""
    log, static = [], CONFIGS[config][1] == "static"
    steps = [Lockstep(name, m, copy.deepcopy(m), static, log, inject)
             for name, m in zip(("target", "drafter"), models)]
    for step in steps:   # the twin runs eager: what the compiler installed set aside
        fast.eager_again(step.twin)
        step.twin.attn_impl = None
    try:
        for decode in runs.values():
            for p in prompts:
                for m in models:
                    if zeroed and m.kv is not None:
                        m.kv.zero_()
                decode(p)
    finally:
        for step in steps:
            step.release()
    return log


def report(config, log, zeroed=False):
    """The verdict lines of one run (see the module's docstring)."""
    bad = [r for r in log if r["logits"] > TOL or r["cache"] > TOL]
    head = f"{config}{' (cache zeroed before each prompt)' if zeroed else ''}: " \
           f"{len(log)} forwards, {len(bad)} differ"
    if not bad:
        return [head]
    r = bad[0]
    other = "" if r["first"] else " (not its first row count)"
    lines = [f"{head}; the first: #{r['n']} {r['model']}, start {r['start']}, {r['rows']} query "
             f"rows, graph [{r['graph']}] call {r['call']}{other}, |logits| {r['logits']:.1e}, "
             f"|cache| {r['cache']:.1e}, first layer {r['layer']}"]
    by_graph = {}
    for r in bad:
        by_graph.setdefault(f"{r['model']} [{r['graph']}]", []).append(r["call"])
    lines += [f"    {g}: calls {', '.join(map(str, calls[:12]))}{' ...' if len(calls) > 12 else ''}"
              for g, calls in by_graph.items()]
    return lines


def setup(device, block_size):
    """The embedded pair in fp32, the threshold rule at `block_size`, its shipped Spiffy graph,
    and the prompts' ids."""
    target, tok = load(DEFAULT_TARGET, device, torch.float32)
    drafter = load(DEFAULT_DRAFTER, device, torch.float32)[0]
    rule = make_rule(target, block_size, threshold=0.9)
    graph = load_graph(graph_path(DEFAULT_TARGET, rule), rule)
    return (target, drafter), rule, graph, [tok.encode(p) for p in PROMPTS]


def free_running(models, rule, graph, prompts, eager):
    """Decoding as a user runs it, every stale cache row garbage (stale_garbage): -> the line
    saying which decoders write other tokens than `eager` ({name: their outputs})."""
    for m in models:
        stale_garbage(m)
    runs = decoders(*models, rule, graph, 3 * rule.block_size)
    wrong = [name for name, decode in runs.items() if [decode(p) for p in prompts] != eager[name]]
    return (f"    free-running, stale rows garbage: {len(runs) - len(wrong)} of {len(runs)} "
            f"decoders write eager's tokens" + (f"; not: {', '.join(wrong)}" if wrong else ""))


def main(configs=tuple(CONFIGS), device=None, block_size=8, budget=150.0, backend=None):
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    warnings.filterwarnings("ignore")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False   # fp32 is fp32
    models, rule, graph, prompts = setup(device, block_size)
    eager = {name: [decode(p) for p in prompts] for name, decode in
             decoders(*models, rule, graph, 3 * block_size).items()}
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {name}, B = {block_size}, fp32, backend "
          f"{backend or 'inductor'}, {len(eager)} decoders x {len(prompts)} prompts", flush=True)
    t0, failed = time.perf_counter(), 0
    for config in configs:
        if CONFIGS[config][3] and device != "cuda":
            print(f"{config}: skipped (needs CUDA)")
            continue
        if time.perf_counter() - t0 > budget:
            print(f"{config}: skipped (past --budget {budget:g} s)")
            continue
        t, options = time.perf_counter(), model_module.flex_kernel_options
        if config == "dyn-flex-main":
            model_module.flex_kernel_options = lambda rows, group: MAIN_KERNEL
        try:
            ms = compiled(config, models, backend)
            runs = decoders(*ms, rule, graph, 3 * block_size)
            log = run(config, ms, runs, prompts)
            differ = any(r["logits"] > TOL or r["cache"] > TOL for r in log)
            print(*report(config, log), sep="\n", flush=True)
            if differ:               # with the cache zeroed before each prompt: do old rows matter?
                print(*report(config, run(config, ms, runs, prompts, zeroed=True), True),
                      sep="\n", flush=True)
            line = free_running(ms, rule, graph, prompts, eager)
            print(line, flush=True)
            failed += differ or "; not:" in line
        except Exception as e:   # a compile error is an answer too
            print(f"{config}: {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)
            failed += 1
        finally:
            model_module.flex_kernel_options = options
        print(f"    ({time.perf_counter() - t:.0f} s)", flush=True)
    return failed


def parse_args(argv=None):
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"comma-separated, from: {', '.join(CONFIGS)} (default: all)")
    ap.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if there is one")
    ap.add_argument("--block-size", type=int, default=8, choices=(4, 8, 32))
    ap.add_argument("--budget", type=float, default=150.0,
                    help="seconds; configurations not started by then are skipped (default 150)")
    ap.add_argument("--backend",
                    help="torch.compile's backend (default inductor; aot_eager: a dry run)")
    a = ap.parse_args(argv)
    unknown = [c for c in a.configs.split(",") if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration {unknown[0]!r}; choose from {', '.join(CONFIGS)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU")
    return dict(configs=a.configs.split(","), device=a.device, block_size=a.block_size,
                budget=a.budget, backend=a.backend)


if __name__ == "__main__":
    sys.exit(1 if main(**parse_args()) else 0)
