"""Benchmark plain decoding, SimSD and Spiffy side by side, in one process, on the same prompts.

Methods (each at every --block-size; "+threshold" runs a method on the threshold rule,
low_confidence_dynamic at 0.9, and compares it with `threshold` instead of `plain`):
  sdar              plain decoding, one token per step, separate commit forward (SDAR's loop)
  plain             the same with the commit fused into the next block's first forward
  threshold         the threshold rule, fused commit
  simsd-paper       the paper's: gamma = B drafts, temporal-mask verifier, accept on agreement
  simsd-exact       the same drafts verified exactly (block copies), the paper's acceptance
  simsd-gated       exact states, accepted only where the target is sure (keeps its answers)
  simsd-lossless    exact states, plain decoding's rule walked through them (must equal plain);
                    simsd-lossless+threshold is what `sample.py --spec simsd` runs
  spiffy            Spiffy, draft graphs instead of a drafter (lossless: must equal plain)
simsd-paper against simsd-exact is the order-versus-leak experiment: both lose the same
answers, so the temporal mask's approximation is not what loses them.
Ablations of simsd-paper on request: --ablate rope-copy (slots without copied positions),
--ablate order (verify left to right instead of by the draft order).

For each: tokens/s, target and drafter forwards per token, tokens per target forward (and its
fraction of the limit B: one forward a block), mean accepted per round, accuracy on the task,
the fraction of prompts whose output is its plain counterpart's ("same"), speedups over `sdar`
and `plain` measured in this run. Greedy. Prompts are interleaved (each prompt through every
method before the next); warm-up is timed apart; clocks are read after a CUDA synchronise;
wall time is the median over --repeats. The last line of stdout is one JSON object. Exit
status 1 if a lossless method (sdar, simsd-lossless, spiffy) differs from its plain
counterpart in fp32; in bf16 the "same" column is the agreement rate (rounding differs with
the shapes of the forwards). Flags, checkpoints, graphs,
--data and --out are checked before the first prompt runs.

    python bench.py                        # embedded models, B=4, 100 held-out problems
    python bench.py --block-size 4,32 --prompts 200 --out results.json
    python bench.py --quick                # smoke test, < 60 s on 2 CPU cores
    python bench.py --target ~/SDAR-8B-Chat --drafter ~/SDAR-1.7B-Chat --data gsm8k.jsonl \\
        --device cuda --dtype bfloat16 --compile --chat
"""
import argparse
import functools
import json
import logging
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

import util
from decode import STRATEGIES, generate
from model import PRESETS, ModelConfig, Transformer
from prepare import extract_answer, problems
from sample import (COMPILE_MODES, DEFAULT_DRAFTER, DEFAULT_TARGET, add_simsd_flags,
                    check_block_size, check_device, check_used, compile_model, load, make_rule)
from speculate import check_settings, simsd_generate
from spiffy import calibrate, graph_path, load_graph, spiffy_generate
from tokenizer import check_same_tokenizer

PAPER_DRAFTS = dict(draft_threshold=None, draft_stop=None)   # gamma = B drafts, one a forward
SIMSD = {  # name -> simsd_generate settings
    "simsd-paper": dict(verifier="temporal", acceptance="paper", **PAPER_DRAFTS),
    "simsd-exact": dict(verifier="copies", acceptance="paper", **PAPER_DRAFTS),
    "simsd-gated": dict(verifier="copies", acceptance="gated"),
    "simsd-lossless": dict(verifier="copies", acceptance="lossless")}
BASES = ("sdar", "plain", *SIMSD, "spiffy")
METHODS = ("sdar", "plain", "threshold", "simsd-gated", "simsd-lossless+threshold", "spiffy",
           "spiffy+threshold")
LOSSLESS = ("sdar", "simsd-lossless", "spiffy")   # exact in exact arithmetic: must equal plain


SPECS = {"none": "plain", "simsd": "simsd-lossless+threshold", "spiffy": "spiffy"}   # sample.py's


def parse_method(name):
    """"simsd-gated+threshold" -> ("simsd-gated", True); "threshold" is plain's own name;
    sample.py's --spec names (SPECS) stand for the method that spec runs."""
    name = SPECS.get(name, name)
    base, threshold = name.removesuffix("+threshold"), name.endswith("+threshold")
    base, threshold = ("plain", True) if base == "threshold" else (base, threshold)
    if base not in BASES or (threshold and base == "sdar"):
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(BASES)} and threshold, "
                         f"each but sdar with +threshold, or sample.py's {', '.join(SPECS)}")
    return base, threshold


class RecompileLimitHits(logging.Handler):
    """Past its recompile limit, dynamo runs a function eager from then on and says so only
    in its log: collect those messages, so that a "compiled" run that was not is flagged."""

    def __init__(self):
        super().__init__()
        self.hits = []
        logging.getLogger("torch._dynamo").addHandler(self)

    def emit(self, record):
        if record.getMessage().startswith("torch._dynamo hit config."):
            self.hits.append(record.getMessage().splitlines()[0])


def load_tasks(data, n, tok, chat):
    """(prompt ids, expected answer) pairs: held-out generated problems, or the first n of a
    GSM8K-style JSONL with "question" and "answer" (the answer's `#### N`, else its last number)."""
    if data is None:
        items = [(f"Question: {p['question']}\nAnswer:", p["result"]) for p in problems(n, "test")]
    else:
        items = []
        for k, rec in util.read_prompts(data, "--data", ("question", "answer"), stop=n):
            items.append((rec["question"], extract_answer(str(rec["answer"]))))
            if items[-1][1] is None:
                raise ValueError(f"{data}:{k}: the answer must hold a number")
        if not items:
            raise ValueError(f"--data file {data} holds no problems")
    return [(tok.encode(tok.apply_chat_template(q) if chat else q), a) for q, a in items]


def calibration_prompts(data, n_measured, tok, chat, note, n=50):
    """Prompts to calibrate a missing Spiffy graph on, never the ones measured: the
    training split's problems, or the --data file's lines after the first n_measured."""
    if data is None:
        note.append("missing Spiffy graphs are calibrated on training-split problems")
        return [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(n, "train")]
    rest = util.read_prompts(data, "--data", start=n_measured, stop=n_measured + n)
    if not rest:
        raise ValueError(f"a Spiffy graph is missing and --data {data} has no lines left after the "
                         f"{n_measured} measured to calibrate it on: give fewer --prompts, or run "
                         f"`python spiffy.py --calibrate --data FILE` first")
    note.append(f"missing Spiffy graphs are calibrated on {data} lines {rest[0][0]}-{rest[-1][0]}, "
                f"which are not measured")
    return [tok.encode(tok.apply_chat_template(r["question"]) if chat else r["question"]) for _, r in rest]


def runner(method, target, drafter, B, graphs, draft_budget=8, strategy=None, **simsd):
    """-> f(prompt ids, max_new_tokens) -> (ids, stats) for one method at block size B;
    `strategy` replaces the one-token rule of the methods without +threshold. Every call gets
    a generator seeded alike, so that `random` positions are comparable across methods."""
    base, threshold = parse_method(method)
    rule = make_rule(target, B, 0.9 if threshold else None, strategy=None if threshold else strategy)
    device = target.embed.weight.device
    seeded = lambda: torch.Generator(device).manual_seed(0)
    if base in ("sdar", "plain"):
        return lambda ids, n: generate(target, ids, n, rule, fuse_commit=base == "plain",
                                       generator=seeded())
    if base in SIMSD:
        kw = {**simsd, **SIMSD[base]}
        return lambda ids, n: simsd_generate(target, drafter, ids, n, rule, generator=seeded(), **kw)
    graph = graphs(rule)
    return lambda ids, n: spiffy_generate(target, ids, n, rule, graph, draft_budget, generator=seeded())


def measure(runs, tasks, max_new_tokens, tok, repeats, device, bar):
    """Every task through every method before the next task (so a slow spell of a shared
    machine hits all methods alike); outputs and counts from the first pass, each method's wall
    time the median over repeats of its summed per-prompt times."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    walls = {name: [0.0] * repeats for name in runs}
    outs, stats = {name: [] for name in runs}, {name: [] for name in runs}
    for r in range(repeats):
        for ids, _ in tasks:
            for name, run in runs.items():
                sync()
                t0 = time.perf_counter()
                out, st = run(ids, max_new_tokens)
                sync()
                walls[name][r] += time.perf_counter() - t0
                if r == 0:
                    outs[name].append(out), stats[name].append(st)
            bar.update(1)
    return outs, {name: summarize(stats[name], outs[name], tasks, tok, statistics.median(walls[name]))
                  for name in runs}


# A model, not a measurement: what the counted forwards would cost for SDAR-8B (target) and
# SDAR-1.7B (drafter) in bf16 on an H200 (spec-sheet peaks), each forward max(weight bytes /
# bandwidth, 2 x params x query rows / peak FLOP/s), attention and KV reads left out; in
# target-forward equivalents (one memory-bound SDAR-8B forward = 1) per token.
GPU_MODEL = dict(pair="SDAR-8B + SDAR-1.7B on an H200, bf16 (modelled)", target="sdar-8b",
                 drafter="sdar-1.7b", bandwidth=4.8e12, flops=989e12)


@functools.cache
def preset_params(preset):
    """Parameters of a model.PRESETS shape, counted on the meta device (no memory)."""
    with torch.device("meta"):
        return sum(p.numel() for p in Transformer(ModelConfig(**PRESETS[preset])).parameters())


def modelled_gpu_cost(rows, rows_draft, tokens, gpu=GPU_MODEL):
    """rows, rows_draft: {query rows: forwards} of the target and the drafter -> modelled
    target-forward equivalents per token."""
    def cost(n_params, counts):
        return sum(n * max(2 * n_params / gpu["bandwidth"], 2 * n_params * T / gpu["flops"])
                   for T, n in counts.items())
    floor = 2 * preset_params(gpu["target"]) / gpu["bandwidth"]      # one SDAR-8B forward, bf16
    return (cost(preset_params(gpu["target"]), rows)
            + cost(preset_params(gpu["drafter"]), rows_draft)) / floor / tokens


def summarize(stats, outs, tasks, tok, wall):
    tokens, nfe = sum(s["tokens"] for s in stats), sum(s["nfe"] for s in stats)
    hist = {}
    for s in stats:
        for k, v in s.get("accept_hist", s.get("steps_per_forward", {})).items():
            hist[k] = hist.get(k, 0) + v
    rounds = sum(hist.values())
    correct = sum(extract_answer(tok.decode(o)) == a for o, (_, a) in zip(outs, tasks))
    ends = {}
    for s in stats:
        for k, v in s.get("round_ends", {}).items():
            ends[k] = ends.get(k, 0) + v
    stops = {}   # why each prompt's decoding ended: a stop id, or max_new_tokens
    rows, rows_draft = Counter(), Counter()   # query rows a forward -> forwards
    for s in stats:
        stops[s["stop"]] = stops.get(s["stop"], 0) + 1
        rows.update(s["rows"]), rows_draft.update(s.get("rows_draft", {}))
    return dict(tokens=tokens, wall_s=wall, tokens_per_s=tokens / wall, round_ends=ends, stops=stops,
                target_fwd_per_token=nfe / tokens,
                draft_fwd_per_token=sum(s.get("nfe_draft", 0) for s in stats) / tokens,
                tokens_per_target_fwd=tokens / nfe, nfe=nfe, hist=hist,
                target_rows_per_token=sum(T * n for T, n in rows.items()) / tokens,
                gpu_fwd_equiv_per_token=modelled_gpu_cost(rows, rows_draft, tokens),
                mean_per_round=sum(k * v for k, v in hist.items()) / max(rounds, 1),
                accuracy=correct / len(tasks))


def graphs_for(target_dir, target, calib_prompts, note):
    """A graph per rule: the one shipped next to the target, else calibrated here on
    calib_prompts() (called once, when the first graph is missing)."""
    cache, prompts = {}, []

    def get(rule):
        key = (rule.block_size, rule.strategy)
        if key not in cache:
            path = graph_path(target_dir, rule)
            if path.is_file():
                cache[key] = load_graph(path, rule)
            else:
                t0 = time.perf_counter()
                prompts[:] = prompts or calib_prompts()
                cache[key] = calibrate(target, prompts, rule)
                note.append(f"calibrated a graph for {key} in {time.perf_counter() - t0:.1f} s "
                            f"({path.name} not found)")
        return cache[key]
    return get


def table(rows):
    cols = [("method", "{}"), ("B", "{}"), ("tok/s", "{:.1f}"), ("x sdar", "{:.2f}"),
            ("x plain", "{:.2f}"), ("tgt fwd/tok", "{:.3f}"), ("drf fwd/tok", "{:.2f}"),
            ("tok/tgt fwd", "{:.2f}"), ("of limit", "{:.0%}"), ("NFE / sdar", "{:.2f}x"),
            ("mean/round", "{:.2f}"), ("accuracy", "{:.1%}"), ("same", "{:.0%}"), ("stopped", "{:.0%}"),
            ("rows/tok", "{:.1f}"), ("GPU fwd/tok*", "{:.3f}")]
    keys = ["method", "block_size", "tokens_per_s", "speedup_vs_sdar", "speedup_vs_plain",
            "target_fwd_per_token", "draft_fwd_per_token", "tokens_per_target_fwd",
            "fraction_of_limit", "nfe_reduction_vs_sdar", "mean_per_round", "accuracy",
            "same_fraction", "stopped_fraction", "target_rows_per_token", "gpu_fwd_equiv_per_token"]
    cells = [[f.format(r[k]) for (_, f), k in zip(cols, keys)] for r in rows]
    widths = [max(len(c[0]), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.rjust(w) for x, w in zip(xs, widths))
    return "\n".join([line([c for c, _ in cols])] + [line(x) for x in cells])


def check_args(methods, block_sizes, prompts, max_new_tokens, repeats, device, drafter, sweep,
               ablate, draft_budget, out, simsd_kw):
    """Every flag, before any file is read: ranges, --out writable, no flag left unused."""
    if not methods:
        raise ValueError(f"no method given; choose from {', '.join(METHODS)}")
    bases = [parse_method(m)[0] for m in methods]
    if len(set(methods)) < len(methods) or len(set(block_sizes)) < len(block_sizes):
        raise ValueError("a method or block size is listed twice")
    for B in block_sizes:
        util.check_positive(block_size=B)
    util.check_positive(prompts=prompts, max_new_tokens=max_new_tokens, repeats=repeats,
                        draft_budget=draft_budget)
    if set(ablate) - {"rope-copy", "order"}:
        raise ValueError(f"unknown --ablate {','.join(ablate)}; choose from rope-copy, order")
    check_device(device)
    simsd = list(SIMSD)
    check_used(bases, f"--methods {','.join(methods)}",
               dict(drafter=simsd, sweep=simsd, ablate=["simsd-paper"], draft_budget=["spiffy"],
                    **{k: simsd for k in simsd_kw}),
               drafter=drafter, sweep=sweep, ablate=ablate or None, draft_budget=draft_budget,
               **simsd_kw)
    check_settings("copies", "gated", None, **{k: v for k, v in simsd_kw.items()}, rope_copy=True,
                   order="tau")
    if out:
        util.check_writable(out, "--out")


def main(target=DEFAULT_TARGET, drafter=None, block_sizes=(4,), methods=METHODS,
         prompts=100, max_new_tokens=64, device="cpu", dtype=None, compile=False, repeats=1,
         data=None, chat=False, sweep=None, ablate=(), draft_budget=None, out=None, strategy=None,
         gate=None, draft_threshold=None, draft_stop=None, speed_of_light=None, stop_ids=None):
    """drafter, sweep, gate, draft_threshold, draft_stop (SimSD), ablate (simsd-paper),
    draft_budget (spiffy): None/() = the default, and an error when no method uses them.
    speed_of_light: a preset or checkpoint directory: run sol.py's figures instead."""
    if speed_of_light:
        from sol import speed_of_light as sol
        check_device(device)
        sol(speed_of_light, device, getattr(torch, dtype or "float32"), compile)
        return 0
    simsd_kw = dict(gate=gate, draft_threshold=draft_threshold, draft_stop=draft_stop)
    methods = [SPECS.get(m, m) for m in methods]     # rows under the names of what they run
    check_args(methods, block_sizes, prompts, max_new_tokens, repeats, device, drafter, sweep,
               ablate, draft_budget, out, simsd_kw)
    drafter, draft_budget = drafter or DEFAULT_DRAFTER, draft_budget or 8
    simsd_kw = {k: v for k, v in simsd_kw.items() if v is not None}
    dtype = getattr(torch, dtype) if dtype else None
    tgt, tok = load(target, device, dtype, stop_ids)
    drf = None
    if any(parse_method(m)[0] in SIMSD for m in methods):
        drf, dtok = load(drafter, device, dtype)
        check_same_tokenizer(dtok, tok)
    for B in block_sizes:
        check_block_size(tgt, B, "target")
        if drf is not None:
            check_block_size(drf, B, "drafter")
    if compile:
        limit_hits = RecompileLimitHits()
        for m in (tgt, drf):
            if m is not None:
                compile_model(m, compile)
    tasks = load_tasks(data, prompts, tok, chat)
    notes, rows, failed = [], [], []
    if chat and tok.chat_template is None:
        notes.append(f"{target} has no chat_template: the prompts are in ChatML")
    graphs = graphs_for(target, tgt, lambda: calibration_prompts(data, len(tasks), tok, chat, notes), notes)
    # every method is compared with its plain counterpart (plain or threshold): run it too
    methods = list(methods) + [p for p in ("plain", "threshold") if p not in methods and any(
        parse_method(m)[1] == (p == "threshold") for m in methods)]
    plan = {}   # (row name, B) -> (method, runner)
    for B in block_sizes:
        for m in methods:
            base, _ = parse_method(m)
            gammas = sorted({g for g in (1, 2, B // 2, B) if 1 <= g <= B}) if base in SIMSD and sweep == "gamma" else [None]
            for g in gammas:
                kw = dict(draft_budget=draft_budget) if base == "spiffy" else \
                    dict(gamma=g, **simsd_kw) if base in SIMSD else {}
                kw["strategy"] = strategy
                plan[(m if g is None else f"{m}(gamma={g})", B)] = (m, runner(m, tgt, drf, B, graphs, **kw))
            if base == "simsd-paper" and "rope-copy" in ablate:
                plan[(f"{m}(no rope copy)", B)] = (m, runner(m, tgt, drf, B, graphs, rope_copy=False))
            if base == "simsd-paper" and "order" in ablate:
                plan[(f"{m}(position order)", B)] = (m, runner(m, tgt, drf, B, graphs, order="position"))
    warmup = {}   # compiled: every prompt, so that every bucket's graph is built before timing
    for key, (_, run) in plan.items():                            # warm-up (and compile)
        t0 = time.perf_counter()
        for ids, _ in tasks if compile else tasks[:1]:
            run(ids, max_new_tokens)
        warmup[key] = time.perf_counter() - t0
    from torch._dynamo.utils import counters
    graphs_after_warmup = counters["stats"]["unique_graphs"]
    bar = tqdm(total=len(tasks) * repeats, desc="bench (prompts)", file=sys.stderr)
    outputs, results = measure({k: run for k, (_, run) in plan.items()}, tasks, max_new_tokens,
                               tok, repeats, device, bar)
    bar.close()
    exact = dtype in (None, torch.float32)
    for (name, B), (m, _) in plan.items():
        r = dict(method=name, block_size=B, warmup_s=warmup[(name, B)], **results[(name, B)])
        base, threshold = parse_method(m)
        plain = "threshold" if threshold else "plain"
        same = [a == b for a, b in zip(outputs[(name, B)], outputs[(plain, B)])]
        r.update(same_as=plain, same_fraction=sum(same) / len(same))
        if base in LOSSLESS and exact and not all(same):
            failed.append(f"{name} at B={B} differs from {plain} on {len(same) - sum(same)} prompt(s)")
        rows.append(r)
    for r in rows:
        base = {m["method"]: m for m in rows if m["block_size"] == r["block_size"]}
        for ref in ("sdar", "plain"):
            r[f"speedup_vs_{ref}"] = r["tokens_per_s"] / base[ref]["tokens_per_s"] if ref in base else float("nan")
        sdar = base.get("sdar")
        r["nfe_reduction_vs_sdar"] = (sdar["target_fwd_per_token"] / r["target_fwd_per_token"]
                                      if sdar else float("nan"))
        r["fraction_of_limit"] = r["tokens_per_target_fwd"] / r["block_size"]
        r["stopped_fraction"] = r["stops"].get("stop_id", 0) / len(tasks)   # the rest ran to the limit
    print(table(rows))
    print(f"* GPU fwd/tok: target-forward equivalents per token, {GPU_MODEL['pair']}: a model of "
          f"the counted forwards, not a measurement")
    for r in rows:   # why SimSD's rounds ended: the drafter wrong where the target is sure, ...
        if r["round_ends"]:
            print(f"{r['method']} B={r['block_size']} rounds ended: {r['round_ends']}")
    for n in notes + [f"FAILED: {f}" for f in failed]:
        print(n)
    dynamo = {}
    if compile:   # graphs compiled after the warm-up: compiles the timed runs paid for
        dynamo = dict(unique_graphs=counters["stats"]["unique_graphs"],
                      graphs_after_warmup=counters["stats"]["unique_graphs"] - graphs_after_warmup,
                      recompile_limit_hits=len(limit_hits.hits))
        logging.getLogger("torch._dynamo").removeHandler(limit_hits)
        print(f"torch.compile: {dynamo}")
        if limit_hits.hits:
            print(f"WARNING: {limit_hits.hits[0]}: part of the 'compiled' run was eager")
    result = dict(target=str(target), drafter=str(drafter), device=device, torch=torch.__version__,
                  prompts=len(tasks), max_new_tokens=max_new_tokens, repeats=repeats,
                  results=rows, lossless_ok=not failed, dynamo=dynamo, notes=notes, gpu_model=GPU_MODEL,
                  date=time.strftime("%Y-%m-%d"))
    if out:
        with util.atomic_write(out) as tmp:
            tmp.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 1 if failed else 0


def parse_args(argv=None):
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(DEFAULT_TARGET))
    ap.add_argument("--drafter", default=None, help=f"simsd's drafter (default {DEFAULT_DRAFTER})")
    ap.add_argument("--block-size", default="4", help="comma-separated list, e.g. 4,32")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated: "
                    f"{', '.join(BASES)}, threshold, any of these but sdar with +threshold, or "
                    f"sample.py's --spec names ({', '.join(f'{k} = {v}' for k, v in SPECS.items())}); "
                    f"default {','.join(METHODS)}")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--compile", nargs="?", const="auto", choices=COMPILE_MODES,
                    help="torch.compile: static shapes and CUDA graphs on CUDA, dynamic on the CPU (auto)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--data", default=None, help="GSM8K-format JSONL (question, answer)")
    ap.add_argument("--chat", action="store_true", help="prompts in the checkpoint's chat template "
                    "(ChatML if it has none)")
    ap.add_argument("--sweep", choices=["gamma"], default=None)
    ap.add_argument("--ablate", default="", help="comma-separated: rope-copy, order")
    ap.add_argument("--draft-budget", type=int, default=None, help="Spiffy's D* (default 8)")
    ap.add_argument("--strategy", default=None, choices=STRATEGIES,
                    help="SDAR strategy for every method without +threshold (default: static)")
    add_simsd_flags(ap)
    ap.add_argument("--quick", action="store_true", help="4 prompts, 32 new tokens: a smoke test")
    ap.add_argument("--out", default=None, help="also save the JSON here")
    ap.add_argument("--speed-of-light", metavar="MODEL", default=None,
                    help="instead: time one decode forward and the decode loop of a random model "
                         "shaped like MODEL (a preset such as sdar-8b, or a checkpoint directory) "
                         "against the memory-bandwidth floor (sol.py)")
    ap.add_argument("--stop-ids", default=None, help="comma-separated token ids that end decoding "
                    "(default: the checkpoint's, as sample.py)")
    a = ap.parse_args(argv)
    block_sizes = util.int_list(a.block_size, "--block-size")
    stop_ids = None if a.stop_ids is None else util.int_list(a.stop_ids, "--stop-ids")
    ablate = tuple(x for x in a.ablate.split(",") if x)
    return dict(target=a.target, drafter=a.drafter, block_sizes=block_sizes,
                methods=tuple(a.methods.split(",")), prompts=4 if a.quick else a.prompts,
                max_new_tokens=32 if a.quick else a.max_new_tokens, device=a.device,
                dtype=a.dtype, compile=a.compile, repeats=a.repeats, data=a.data, chat=a.chat,
                sweep=a.sweep, ablate=ablate, draft_budget=a.draft_budget, out=a.out,
                gate=a.gate, draft_threshold=a.draft_threshold, draft_stop=a.draft_stop,
                strategy=a.strategy, speed_of_light=a.speed_of_light, stop_ids=stop_ids)


if __name__ == "__main__":
    sys.exit(util.run(lambda: main(**parse_args())))
