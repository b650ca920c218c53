"""Benchmark plain decoding, SimSD and Spiffy side by side, in one process, on the same prompts.

Methods (each at every --block-size):
  sdar              plain decoding, one token per step, separate commit forward (SDAR's loop)
  plain             the same with the commit fused into the next block's first forward
  threshold         the threshold rule (low_confidence_dynamic, 0.9), fused commit
  simsd             SimSD with the drafter (gamma = B unless --sweep gamma)
  spiffy            Spiffy on the one-token rule (lossless: must equal `plain`)
  spiffy+threshold  Spiffy on the threshold rule (lossless: must equal `threshold`)
Ablations on request: --ablate rope-copy (SimSD without copied positions), --ablate order
(SimSD verifying left to right instead of by the draft order).

For each: tokens/s, target and drafter forwards per token, tokens per target forward (and its
fraction of the limit B: one forward a block), mean accepted per round, accuracy on the task,
speedups over `sdar` and `plain` measured in this run. Greedy. Warm-up is timed apart; clocks
are read after a CUDA synchronise; wall time is the median over --repeats. The last line of
stdout is one JSON object. Exit status 1 if a lossless method's output differs from its
plain counterpart. Flags, checkpoints, graphs, --data and --out are checked before the first
prompt runs.

    python bench.py                        # embedded models, B=4, 100 held-out problems
    python bench.py --block-size 4,32 --prompts 200 --out results.json
    python bench.py --quick                # smoke test, < 60 s on 2 CPU cores
    python bench.py --target ~/SDAR-8B-Chat --drafter ~/SDAR-1.7B-Chat --data gsm8k.jsonl \\
        --device cuda --dtype bfloat16 --compile --chat
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

import util
from decode import generate
from prepare import extract_answer, problems
from sample import (DEFAULT_DRAFTER, DEFAULT_TARGET, check_block_size, check_device,
                    check_used, load, make_rule)
from speculate import simsd_generate
from spiffy import calibrate, graph_path, load_graph, spiffy_generate
from tokenizer import check_same_tokenizer

METHODS = ("sdar", "plain", "threshold", "simsd", "spiffy", "spiffy+threshold")
LOSSLESS = {"spiffy": "plain", "spiffy+threshold": "threshold"}


def load_tasks(data, n, tok, chat):
    """(prompt ids, expected answer) pairs: held-out generated problems, or a GSM8K-style JSONL
    with "question" and "answer" (the answer's `#### N`, else its last number)."""
    if data is None:
        items = [(f"Question: {p['question']}\nAnswer:", p["result"]) for p in problems(n, "test")]
    else:
        path = Path(data)
        if not path.is_file():
            raise FileNotFoundError(f"--data file {path} not found")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()[:n]
        except UnicodeDecodeError:
            raise ValueError(f"--data file {path} is not UTF-8 text") from None
        items = []
        for k, line in enumerate(lines):
            try:
                rec = json.loads(line)
                item = (rec["question"], extract_answer(str(rec["answer"])))
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{path}:{k + 1}: not a JSON object with 'question' and 'answer'") from None
            if not isinstance(item[0], str) or not item[0] or item[1] is None:
                raise ValueError(f"{path}:{k + 1}: the question must be text and the answer must hold a number")
            items.append(item)
        if not items:
            raise ValueError(f"--data file {path} holds no problems")
    return [(tok.encode(tok.apply_chat_template(q) if chat else q), a) for q, a in items]


def runner(method, target, drafter, B, graphs, gamma=None, rope_copy=True, order="tau", draft_budget=8):
    """-> f(prompt ids, max_new_tokens, eos) -> (ids, stats) for one method at block size B."""
    threshold = 0.9 if method in ("threshold", "spiffy+threshold") else None
    rule = make_rule(target, B, threshold)
    if method in ("sdar", "plain", "threshold"):
        fuse = method != "sdar"
        return lambda ids, n, eos: generate(target, ids, n, rule, fuse_commit=fuse, eos_id=eos)
    if method == "simsd":
        return lambda ids, n, eos: simsd_generate(target, drafter, ids, n, rule, gamma=gamma,
                                                  rope_copy=rope_copy, order=order, eos_id=eos)
    graph = graphs(rule)
    return lambda ids, n, eos: spiffy_generate(target, ids, n, rule, graph, draft_budget, eos_id=eos)


def measure(run, tasks, max_new_tokens, eos, tok, repeats, device, bar):
    """Run every task; outputs and counts from the first pass, wall time the median."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    walls, outs, stats = [], [], []
    for r in range(repeats):
        sync()
        t0 = time.perf_counter()
        for ids, _ in tasks:
            out, st = run(ids, max_new_tokens, eos)
            if r == 0:
                outs.append(out), stats.append(st)
            bar.update(1)
        sync()
        walls.append(time.perf_counter() - t0)
    tokens, nfe = sum(s["tokens"] for s in stats), sum(s["nfe"] for s in stats)
    hist = {}
    for s in stats:
        for k, v in s.get("accept_hist", s.get("steps_per_forward", {})).items():
            hist[k] = hist.get(k, 0) + v
    rounds = sum(hist.values())
    correct = sum(extract_answer(tok.decode(o)) == a for o, (_, a) in zip(outs, tasks))
    wall = statistics.median(walls)
    return outs, dict(tokens=tokens, wall_s=wall, tokens_per_s=tokens / wall,
                      target_fwd_per_token=nfe / tokens,
                      draft_fwd_per_token=sum(s.get("nfe_draft", 0) for s in stats) / tokens,
                      tokens_per_target_fwd=tokens / nfe, nfe=nfe, hist=hist,
                      mean_per_round=sum(k * v for k, v in hist.items()) / max(rounds, 1),
                      accuracy=correct / len(tasks))


def graphs_for(target_dir, target, calib_prompts, tok, note):
    """A graph per rule: the one shipped next to the target, else calibrated here."""
    cache = {}

    def get(rule):
        key = (rule.block_size, rule.strategy)
        if key not in cache:
            path = graph_path(target_dir, rule)
            if path.is_file():
                cache[key] = load_graph(path, rule)
            else:
                t0 = time.perf_counter()
                prompts = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in calib_prompts]
                cache[key] = calibrate(target, prompts, rule)
                note.append(f"calibrated a graph for {key} in {time.perf_counter() - t0:.1f} s "
                            f"({path.name} not found)")
        return cache[key]
    return get


def table(rows):
    cols = [("method", "{}"), ("B", "{}"), ("tok/s", "{:.1f}"), ("x sdar", "{:.2f}"),
            ("x plain", "{:.2f}"), ("tgt fwd/tok", "{:.3f}"), ("drf fwd/tok", "{:.2f}"),
            ("tok/tgt fwd", "{:.2f}"), ("of limit", "{:.0%}"), ("NFE / sdar", "{:.2f}x"),
            ("mean/round", "{:.2f}"), ("accuracy", "{:.1%}")]
    keys = ["method", "block_size", "tokens_per_s", "speedup_vs_sdar", "speedup_vs_plain",
            "target_fwd_per_token", "draft_fwd_per_token", "tokens_per_target_fwd",
            "fraction_of_limit", "nfe_reduction_vs_sdar", "mean_per_round", "accuracy"]
    cells = [[f.format(r[k]) for (_, f), k in zip(cols, keys)] for r in rows]
    widths = [max(len(c[0]), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.rjust(w) for x, w in zip(xs, widths))
    return "\n".join([line([c for c, _ in cols])] + [line(x) for x in cells])


def check_args(methods, block_sizes, prompts, max_new_tokens, repeats, device, drafter, sweep,
               ablate, draft_budget, out):
    """Every flag, before any file is read: ranges, --out writable, no flag left unused."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(f"unknown method(s) {', '.join(map(repr, unknown))}; choose from {', '.join(METHODS)}")
    if len(set(methods)) < len(methods) or len(set(block_sizes)) < len(block_sizes):
        raise ValueError("a method or block size is listed twice")
    for B in block_sizes:
        util.check_positive(block_size=B)
    util.check_positive(prompts=prompts, max_new_tokens=max_new_tokens, repeats=repeats,
                        draft_budget=draft_budget)
    if set(ablate) - {"rope-copy", "order"}:
        raise ValueError(f"unknown --ablate {','.join(ablate)}; choose from rope-copy, order")
    check_device(device)
    spiffy = ["spiffy", "spiffy+threshold"]
    check_used(methods, f"--methods {','.join(methods)}",
               dict(drafter=["simsd"], sweep=["simsd"], ablate=["simsd"], draft_budget=spiffy),
               drafter=drafter, sweep=sweep, ablate=ablate or None, draft_budget=draft_budget)
    if out:
        util.check_writable(out, "--out")


def main(target=DEFAULT_TARGET, drafter=None, block_sizes=(4,), methods=METHODS,
         prompts=100, max_new_tokens=64, device="cpu", dtype=None, compile=False, repeats=1,
         data=None, chat=False, sweep=None, ablate=(), draft_budget=None, out=None):
    """drafter, sweep, ablate (simsd), draft_budget (spiffy): None/() = the default, and an
    error when none of the methods uses them."""
    check_args(methods, block_sizes, prompts, max_new_tokens, repeats, device, drafter, sweep,
               ablate, draft_budget, out)
    drafter, draft_budget = drafter or DEFAULT_DRAFTER, draft_budget or 8
    dtype = getattr(torch, dtype) if dtype else None
    tgt, tok = load(target, device, dtype)
    drf = None
    if "simsd" in methods:
        drf, dtok = load(drafter, device, dtype)
        check_same_tokenizer(dtok, tok)
    for B in block_sizes:
        check_block_size(tgt, B, "target")
        if drf is not None:
            check_block_size(drf, B, "drafter")
    if compile:
        for m in (tgt, drf):
            if m is not None:
                m.compile(dynamic=True)
    tasks = load_tasks(data, prompts, tok, chat)
    notes, rows, failed = [], [], []
    graphs = graphs_for(target, tgt, problems(50, "train"), tok, notes)
    plan = []
    for B in block_sizes:
        for m in methods:
            sweep_gammas = sorted({g for g in (1, 2, B // 2, B) if 1 <= g <= B})
            gammas = sweep_gammas if (m == "simsd" and sweep == "gamma") else [None]
            plan += [(m, B, dict(gamma=g), m if g is None else f"simsd(gamma={g})") for g in gammas]
        if "simsd" in methods:
            if "rope-copy" in ablate:
                plan.append(("simsd", B, dict(rope_copy=False), "simsd(no rope copy)"))
            if "order" in ablate:
                plan.append(("simsd", B, dict(order="position"), "simsd(position order)"))
    runs = [runner(method, tgt, drf, B, graphs, **(dict(draft_budget=draft_budget)
                                                   if method.startswith("spiffy") else kw))
            for method, B, kw, name in plan]           # loads every graph before the first run
    bar = tqdm(total=len(plan) * len(tasks) * repeats, desc="bench", file=sys.stderr)
    outputs = {}
    for (method, B, kw, name), run in zip(plan, runs):
        t0 = time.perf_counter()
        run(tasks[0][0], max_new_tokens, tok.eos_id)              # warm-up (and compile)
        warmup = time.perf_counter() - t0
        outs, r = measure(run, tasks, max_new_tokens, tok.eos_id, tok, repeats, device, bar)
        outputs[(name, B)] = outs
        rows.append(dict(method=name, block_size=B, warmup_s=warmup, **r))
    bar.close()
    for r in rows:
        base = {m["method"]: m for m in rows if m["block_size"] == r["block_size"]}
        for ref in ("sdar", "plain"):
            r[f"speedup_vs_{ref}"] = r["tokens_per_s"] / base[ref]["tokens_per_s"] if ref in base else float("nan")
        sdar = base.get("sdar")
        r["nfe_reduction_vs_sdar"] = (sdar["target_fwd_per_token"] / r["target_fwd_per_token"]
                                      if sdar else float("nan"))
        r["fraction_of_limit"] = r["tokens_per_target_fwd"] / r["block_size"]
        plain = LOSSLESS.get(r["method"])
        if plain and (plain, r["block_size"]) in outputs:
            r["identical_to"] = plain
            if outputs[(r["method"], r["block_size"])] != outputs[(plain, r["block_size"])]:
                failed.append(f"{r['method']} at B={r['block_size']} differs from {plain}")
    print(table(rows))
    for n in notes + [f"FAILED: {f}" for f in failed]:
        print(n)
    dynamo = {}
    if compile:
        from torch._dynamo.utils import counters
        dynamo = {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles")}
        print(f"torch._dynamo counters: {dynamo}")
    result = dict(target=str(target), drafter=str(drafter), device=device, torch=torch.__version__,
                  prompts=len(tasks), max_new_tokens=max_new_tokens, repeats=repeats,
                  results=rows, lossless_ok=not failed, dynamo=dynamo, notes=notes,
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
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--data", default=None, help="GSM8K-format JSONL (question, answer)")
    ap.add_argument("--chat", action="store_true", help="ChatML prompts (chat checkpoints)")
    ap.add_argument("--sweep", choices=["gamma"], default=None)
    ap.add_argument("--ablate", default="", help="comma-separated: rope-copy, order")
    ap.add_argument("--draft-budget", type=int, default=None, help="Spiffy's D* (default 8)")
    ap.add_argument("--quick", action="store_true", help="4 prompts, 32 new tokens: a smoke test")
    ap.add_argument("--out", default=None, help="also save the JSON here")
    a = ap.parse_args(argv)
    block_sizes = util.int_list(a.block_size, "--block-size")
    ablate = tuple(x for x in a.ablate.split(",") if x)
    return dict(target=a.target, drafter=a.drafter, block_sizes=block_sizes,
                methods=tuple(a.methods.split(",")), prompts=4 if a.quick else a.prompts,
                max_new_tokens=32 if a.quick else a.max_new_tokens, device=a.device,
                dtype=a.dtype, compile=a.compile, repeats=a.repeats, data=a.data, chat=a.chat,
                sweep=a.sweep, ablate=ablate, draft_budget=a.draft_budget, out=a.out)


if __name__ == "__main__":
    sys.exit(util.run(lambda: main(**parse_args())))
