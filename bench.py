"""Benchmark plain decoding, SimSD and Spiffy side by side, in one process, on the same prompts.

Methods (each at every --block-size; "+threshold" runs one on the threshold rule at 0.9 and
compares it with `threshold`, the others with `plain`, one token a step):
  sdar            plain decoding, separate commit forward (SDAR's own loop)
  plain           the same with the commit fused into the next block's first forward
  threshold       the threshold rule (low_confidence_dynamic), fused commit
  simsd-paper     the paper's: gamma = B drafts, temporal-mask verifier, accept on agreement
                  (simsd-temporal: sample.py's --verify temporal --accept paper, priced)
  simsd-exact     the same drafts verified exactly (block copies), the paper's acceptance
  simsd-gated     exact states, accepted only where the target is sure (keeps its answers)
  simsd-lossless  exact states, plain decoding's rule walked through them (must equal plain)
  simsd-trajectory, simsd-lookup   the same without a drafter (variants.py), and -paper: their
                  tokens on the temporal mask, accepted on agreement
  spiffy+static   draft graphs from the target itself instead of a drafter (must equal plain)
  none, simsd, spiffy   sample.py's --spec names: what that spec runs (SPECS)

Per row: tokens/s (the median of --repeats passes, prompts interleaved, warm-up timed apart) and
its ratio to `threshold` and `sdar` (the median of the passes' ratios), forwards per token, tokens
per target forward (and its fraction of the limit B (1 + K), K the blocks a round can reach past
its own), host syncs per target forward, accuracy, "same": the share of prompts whose output is its
plain counterpart's, "= eager": a compiled row's with its eager self. The last line is one JSON
object. Exit 1 if a lossless method or a compiled row changed a token in fp32 (bf16: rates).

    python bench.py --block-size 4,8,32 --prompts 40 --repeats 2 --out docs/bench.json
    python bench.py --quick                # smoke test, < 60 s on 2 CPU cores
    python bench.py --target ~/SDAR-8B-Chat --drafter ~/SDAR-1.7B-Chat --data gsm8k.jsonl \\
        --device cuda --dtype bfloat16 --compile --chat
"""
import argparse, hashlib, json, statistics, sys, time
from collections import Counter, defaultdict

import torch
from torch._dynamo.utils import counters
from tqdm import tqdm

import cli, parallel
from decode import STRATEGIES, SYNCS
from loading import util
from compiling import RecompileLimitHits, compiled_copies, warm_up
from decoder import Decoder
from measure import costs
from measure.pricing import Pricing, default_rows, price
from measure.counts import reach_check
from measure.graphs import graphs_for
from measure.sol import GPU_MODEL, modelled_gpu_cost, speed_of_light as sol
from serve.batch import decode_all as batch_decode, rows_keep_their_bits
from speculate import Settings
from spiffy import DRAFT_BUDGET
from training.tasks import TASKS, calibration_prompts, extract_answer, load_tasks

SIMSD = {  # name -> simsd_generate settings (the paper's: gamma = B drafts, one a forward)
    "simsd-paper": dict(verifier="temporal", acceptance="paper", draft_threshold=None, draft_stop=None),
    "simsd-temporal": dict(verifier="temporal", acceptance="paper"),   # sample.py's --verify temporal --accept paper
    "simsd-exact": dict(verifier="copies", acceptance="paper", draft_threshold=None, draft_stop=None),
    "simsd-gated": dict(verifier="copies", acceptance="gated"),
    "simsd-lossless": dict(verifier="copies", acceptance="lossless"),
    **{f"simsd-{r}{paper}": dict(verifier=v, acceptance=a, reference=r) for r in ("trajectory", "lookup")
       for paper, v, a in (("", "copies", "lossless"), ("-paper", "temporal", "paper"))}}   # no drafter
DRAFTED, TEMPORAL = [m for m in SIMSD if "reference" not in SIMSD[m]], [m for m in SIMSD if "temporal" in SIMSD[m].values()]
BASES = ("sdar", "plain", *SIMSD, "spiffy")
NAMES = ("sdar", "plain", "threshold", *SIMSD, *(f"{m}+threshold" for m in SIMSD), "spiffy+static",
         "spiffy+threshold")   # every method, by the name its row gets
METHODS = ("sdar", "plain", "threshold", "simsd-gated", "simsd-lossless+threshold", "spiffy+static",
           "spiffy+threshold")
LOSSLESS = ("sdar", *(m for m in SIMSD if "lossless" in SIMSD[m].values()), "spiffy")   # exact: must equal plain
ALIAS = {"simsd-lossless": "simsd", **{m: m.replace("-paper", "-temporal") for m in TEMPORAL if m != "simsd-paper"}}   # a row's method -> its tables (the paper's drafter: none)
SPECS = {"none": "threshold", "simsd": "simsd-lossless+threshold", "spiffy": "spiffy+threshold"}  # sample.py's
ABLATIONS = (("rope-copy", "no rope copy", dict(rope_copy=False)), ("order", "position order", dict(order="position")))
TAGS = {"both": " compiled", "drafter": " (drafter compiled)"}   # --compile both / drafter: the extra rows' names end so
COMPILED, DRAFTER_COMPILED = TAGS.values()
PAIRS = {"copies": ("all copies", dict(table="none")), "learn": ("tables alone", dict(learn=False))}  # --sweep: a twin row
SWEPT = {"gamma": DRAFTED, "steps": DRAFTED, "lookahead": [m for m in SIMSD if m not in TEMPORAL]}   # the methods each sweep applies to


def parse_method(name):
    """"simsd-gated+threshold" -> ("simsd-gated", True): the base method and whether it runs
    on the threshold rule; "threshold" is plain's own name; "spiffy+static" is Spiffy on the
    one-token rule (bare "spiffy" is sample.py's, SPECS)."""
    name = SPECS.get(name, name)
    base, threshold = name.removesuffix("+threshold"), name.endswith("+threshold")
    base, threshold = ("plain", True) if base == "threshold" else (base, threshold)
    base = "spiffy" if name == "spiffy+static" else "" if base == "spiffy" and not threshold else base
    if base not in BASES or (threshold and base == "sdar"):
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(NAMES)}, or sample.py's "
                         f"{', '.join(f'{k} ({v})' for k, v in SPECS.items())}")
    return base, threshold


def runner(method, target, drafter, B, graphs, draft_budget=DRAFT_BUDGET, strategy=None, target_dir=None,
           priced=None, temperature=0.0, **simsd):
    """-> f(prompt ids, max_new_tokens, models=None) -> (ids, stats): one method at block size B as a
    decoder.Decoder; `strategy` replaces the one-token rule of the methods without +threshold; priced:
    measure.pricing.price's keyword arguments (its cost table, row cap, device, compile and batch) for
    the speculative methods (None: unpriced, every copy verified). Each call's generator is seeded alike, so that `random` positions are
    comparable across methods."""
    base, threshold = parse_method(method)
    rule = cli.make_rule(target, B, cli.THRESHOLD if threshold else None, strategy=None if threshold else strategy,
                         temperature=temperature)
    seeded = lambda: torch.Generator(target.embed.weight.device).manual_seed(0)
    if base in ("sdar", "plain"):
        dec = Decoder("none", target, rule, settings=dict(fuse_commit=base != "sdar"))
    else:   # priced (measure/pricing.py): copies capped, calibrated, sized; SimSD's drafter only where it pays
        lossless = SIMSD.get(base, {}).get("acceptance", "lossless") == "lossless"
        drafter = drafter if base in DRAFTED else None
        settings = dict(simsd, **SIMSD[base]) if base in SIMSD else dict(graph=graphs(rule), draft_budget=draft_budget)
        pricing = Pricing() if priced is None else price(ALIAS.get(base, base), target_dir, target, rule, drafter,
                                                         lossless=lossless, settings=settings, **priced)
        dec = Decoder("simsd" if base in SIMSD else "spiffy", target, rule, drafter, settings, pricing)
    run = lambda ids, n, models=None: dec(ids, n, seeded(), models=models)   # noqa: E731
    run.warm = dict(zip(("target", "drafter"), dec.models), max_blocks=dec.max_blocks)
    run.models, run.table = dec.models, {} if dec.pricing is None else dict(
        costs.named(dec.pricing.cost), **dict(rule_alone=dec.pricing.why) if dec.pricing.alone else {})
    why = dec.pricing and dec.pricing.why   # (the reach table used, or why the rule runs alone)
    run.note = why and (why if dec.pricing.alone else f"B={B} {ALIAS.get(base, base)}: {why}")
    return run


def measure(plan, tasks, max_new_tokens, tok, repeats, device, compiled):
    """Warm-up timed apart (compiled(row): compiling.warm_up, every graph built first; else one
    prompt), then each task through every method before the next, each method first in turn (a
    slow spell of a shared machine, or a slow place in the order, hits all alike). Outputs and
    counts from the first pass; wall time the median over repeats. -> (outputs, each row's
    figures, graphs compiled in the timed passes)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    warmup, walls, outs, stats = Counter(), {key: [0.0] * repeats for key in plan}, {key: [] for key in plan}, {key: [] for key in plan}
    runs = list(plan.items())
    for key, (_, run) in runs:
        t0 = time.perf_counter()
        if compiled(key[0]):
            warm_up([run], [ids for ids, _ in tasks], max_new_tokens, key[1], **run.warm)
        else:
            run(tasks[0][0], max_new_tokens)
        warmup[key] += time.perf_counter() - t0
    graphs_after_warmup = counters["stats"]["unique_graphs"]
    for r in tqdm(range(repeats * len(tasks)), desc="bench (prompts)", file=sys.stderr):
        ids = tasks[r % len(tasks)][0]
        for key, (_, run) in runs[r % len(runs):] + runs[:r % len(runs)]:   # each method first in turn
            t0 = sync() or time.perf_counter()
            out, st = run(ids, max_new_tokens)
            sync()
            walls[key][r // len(tasks)] += time.perf_counter() - t0
            if r < len(tasks):
                outs[key].append(out), stats[key].append(st)
    return outs, {key: dict(summarize(stats[key], outs[key], tasks, tok, walls[key]), warmup_s=warmup[key]) for key in plan}, \
        counters["stats"]["unique_graphs"] - graphs_after_warmup


def by_batch(plans, batches, tasks, max_new_tokens, repeats, device, exact):
    """--batch: each row's method decodes all the tasks N at a time (serve/batch.py; plans[N]: priced for N), methods
    interleaved; tokens/s (tail included) the median of repeats; x threshold at N (same pass) and x its own N = 1
    (same round of passes) the median of the passes' ratios; each output against N = 1's (fp32: a change fails)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    prompts, walls, first = [ids for ids, _ in tasks], defaultdict(list), {}
    go = lambda run, n, N, ps=prompts: batch_decode(lambda i, p, t, d: run(p, n, (t, d)), ps, run.models, N)
    for N in batches:       # warm-up: one block of N prompts at every N
        for (_, B), (_, run) in plans[N].items():
            go(run, B, N, prompts[:N])
    for r in tqdm(range(repeats * len(batches)), desc="bench (batches)", file=sys.stderr):
        runs, k = list(plans[N := batches[r % len(batches)]].items()), r // len(batches)
        for key, (_, run) in runs[k % len(runs):] + runs[:k % len(runs)]:   # each method first in turn
            t0, syncs = sync() or time.perf_counter(), SYNCS["host"]
            results, pools = go(run, max_new_tokens, N)
            sync()
            walls[key, N].append(time.perf_counter() - t0)
            first.setdefault((key, N), (results, pools, SYNCS["host"] - syncs))
    return batch_rows(first, walls, batches, exact)


def batch_rows(first, walls, batches, exact):
    """by_batch's rows from each (row, N)'s first pass and its wall times -> (rows, failures)."""
    rows, failed = [], []
    for ((name, B), N), (results, (tgt, drf), syncs) in sorted(first.items(), key=lambda x: (x[0][1], x[0][0][1])):
        tokens, outs = sum(len(o) for o, _ in results), [o for o, _ in results]
        same = [a == b for a, b in zip(outs, [o for o, _ in first[(name, B), 1][0]])]
        rows.append(dict(method=name, block_size=B, batch=N, tokens=tokens, pass_wall_s=walls[(name, B), N], tokens_per_s=tokens /
            statistics.median(walls[(name, B), N]), target_fwd_per_token=tgt.forwards / tokens, same_as_batch_1=sum(same) / len(same),
            rows_per_forward=sum(T * n for T, n in tgt.query_rows.items()) / tgt.forwards, draft_fwd_per_token=drf.forwards / tokens
            if drf else 0.0, kv_mib_per_request=(tgt.slot_bytes() + (drf.slot_bytes() if drf else 0)) / 2 ** 20,
            gpu_fwd_equiv_per_token=modelled_gpu_cost(tgt.query_rows, drf.query_rows if drf else {}, tokens, syncs)))
        if exact and not all(same) and not (tgt.buckets or drf and drf.buckets):   # buckets: a rate
            failed.append(f"{name} at B={B}, batch {N} differs from batch 1 on {len(same) - sum(same)} prompt(s)")
    at = {(r["method"], r["block_size"], r["batch"]): r for r in rows}
    for r in rows:   # (pass k of every row: in round k of by_batch)
        r["speedup_vs_threshold"], r["speedup_vs_batch_1"] = (vs(r, at.get(k)) for k in (
            ("threshold", r["block_size"], r["batch"]), (r["method"], r["block_size"], 1)))
    return rows, failed


def report(rows, failed, notes, out, head):
    """--batch's table, notes and failures printed, the JSON saved and printed -> exit status."""
    print("\n".join([table(rows)] + notes + [f"FAILED: {f}" for f in failed]))
    print(json.dumps(save(out, dict(head, notes=notes, results=rows, lossless_ok=not failed, gpu_model=GPU_MODEL,
                                    date=time.strftime("%Y-%m-%d")))))
    return 1 if failed else 0


def vs(r, o):   # row r's tokens/s over row o's: the median of the passes' ratios (pass k of both in one round)
    return float("nan") if o is None else r["tokens"] / o["tokens"] * statistics.median(
        a / b for a, b in zip(o["pass_wall_s"], r["pass_wall_s"]))


def summarize(stats, outs, tasks, tok, walls):
    """One method's prompts -> its row's figures (counts exact; wall time as measured, each pass's)."""
    total = lambda key: sum((Counter(s.get(key, {})) for s in stats), Counter())
    tokens, nfe = sum(s["tokens"] for s in stats), sum(s["nfe"] for s in stats)
    hist = total("accept_hist") or total("steps_per_forward")    # SimSD's drafts, or Spiffy's steps
    rows, rows_draft, syncs = total("rows"), total("rows_draft"), sum(s["syncs"] for s in stats)   # rows: query rows -> forwards
    correct = sum(extract_answer(tok.decode(o)) == a for o, (_, a) in zip(outs, tasks) if a is not None)
    wall = statistics.median(walls)
    return dict(tokens=tokens, pass_wall_s=walls, wall_s=wall, tokens_per_s=tokens / wall, nfe=nfe, hist=dict(hist),
                round_ends=dict(total("round_ends")), stops=dict(Counter(s["stop"] for s in stats)),
                target_fwd_per_token=nfe / tokens, tokens_per_target_fwd=tokens / nfe,
                draft_fwd_per_token=sum(s.get("nfe_draft", 0) for s in stats) / tokens,
                target_rows_per_token=sum(T * n for T, n in rows.items()) / tokens,
                syncs_per_target_fwd=syncs / nfe, reach_vs_walked=reach_check(total("reach_by_rank"), total("walked_by_rank"))[0],
                gpu_fwd_equiv_per_token=modelled_gpu_cost(rows, rows_draft, tokens, syncs),
                mean_per_round=sum(k * v for k, v in hist.items()) / max(sum(hist.values()), 1),
                accuracy=correct / len(tasks) if tasks[0][1] is not None else float("nan"), lookahead=max(s.get("lookahead", 0) for s in stats))


COLUMNS = [("method", "method", "{}"), ("B", "block_size", "{}"), ("batch", "batch", "{}"), ("tok/s", "tokens_per_s", "{:.1f}"),
           ("x batch 1", "speedup_vs_batch_1", "{:.2f}"), ("rows/fwd", "rows_per_forward", "{:.1f}"),
           ("= batch 1", "same_as_batch_1", "{:.0%}"), ("KV MiB/req", "kv_mib_per_request", "{:.1f}"),
           ("x thr", "speedup_vs_threshold", "{:.2f}"), ("x sdar", "speedup_vs_sdar", "{:.2f}"), ("x eager", "speedup_vs_eager", "{:.2f}"),
           ("tgt fwd/tok", "target_fwd_per_token", "{:.3f}"), ("drf fwd/tok", "draft_fwd_per_token", "{:.2f}"),
           ("tok/tgt fwd", "tokens_per_target_fwd", "{:.2f}"), ("of limit", "fraction_of_limit", "{:.0%}"),
           ("mean/round", "mean_per_round", "{:.2f}"), ("accuracy", "accuracy", "{:.1%}"),
           ("same", "same_fraction", "{:.0%}"), ("= eager", "same_as_eager", "{:.0%}"), ("stopped", "stopped_fraction", "{:.0%}"),
           ("reach/walked", "reach_vs_walked", "{:.2f}"), ("rows/tok", "target_rows_per_token", "{:.1f}"), ("syncs/fwd", "syncs_per_target_fwd", "{:.1f}"),
           ("GPU fwd/tok*", "gpu_fwd_equiv_per_token", "{:.3f}")]


def table(rows):
    columns = [c for c in COLUMNS if any(c[1] in r for r in rows)]     # x eager: with --compile both or drafter
    cells = [[f.format(r.get(k, float("nan"))) for _, k, f in columns] for r in rows]
    widths = [max(len(c[0]), *(len(x[i]) for x in cells)) for i, c in enumerate(columns)]
    line = lambda xs: "  ".join(x.rjust(w) for x, w in zip(xs, widths))
    return "\n".join([line([c for c, _, _ in columns])] + [line(x) for x in cells] + [
        f"* GPU fwd/tok: target-forward equivalents per token, {GPU_MODEL['pair']}: a model of the counted forwards and host syncs (sol.GPU_MODEL), not a measurement"])


def check_args(methods, block_sizes, prompts, max_new_tokens, repeats, device, out, compile=None, dtype=None, batch=None,
               **flags):
    """Every flag, before any file is read: ranges, --out writable, no flag that none of the
    methods reads (flags: drafter, sweep, ablate, draft_budget, gate, draft_*; None = unused)."""
    bases = [parse_method(m)[0] for m in methods]
    if batch is not None and (len(set(batch)) < len(batch) or min(batch) < 1 or 1 not in batch):
        raise ValueError(f"--batch {','.join(map(str, batch))}: give distinct sizes >= 1, 1 among them (the baseline of 'x batch 1')")
    if compile == "drafter" and not set(bases) & set(DRAFTED):
        raise ValueError("--compile drafter: none of --methods runs a drafter (simsd does)")
    if not methods or len(set(methods)) < len(methods) or len(set(block_sizes)) < len(block_sizes):
        raise ValueError(f"a method or block size is listed twice, or none is (methods: {', '.join(NAMES)})")
    util.check_positive(prompts=prompts, max_new_tokens=max_new_tokens, repeats=repeats,
                        draft_budget=flags["draft_budget"], block_size=min(block_sizes, default=1))
    if set(flags["ablate"] or ()) - {a for a, _, _ in ABLATIONS}:
        raise ValueError(f"unknown --ablate {','.join(flags['ablate'])}; choose from rope-copy, order")
    cli.check_device(device, dtype)
    own_drafts = [m for m in DRAFTED if "draft_threshold" not in SIMSD[m]]   # not the paper's gamma = B
    cli.check_used(bases, f"--methods {','.join(methods)}",
                   dict(drafter=DRAFTED, lookup_n=[m for m in SIMSD if "lookup" in m], sweep=SWEPT.get(flags["sweep"], [*SIMSD, "spiffy"]),
                        ablate=["simsd-paper"], draft_budget=["spiffy"], gate=["simsd-gated"], draft_threshold=own_drafts,
                        draft_stop=own_drafts, draft_steps=DRAFTED, lookahead=[m for m in SIMSD if m not in TEMPORAL]), **flags)
    Settings(lookahead=flags["lookahead"]).check()
    cli.check_unit(gate=flags["gate"], draft_threshold=flags["draft_threshold"], draft_stop=flags["draft_stop"])
    if out:
        util.check_writable(out, "--out")


def plan_runs(methods, block_sizes, tgt, drf, graphs, sweep, ablate, strategy, draft_budget, target_dir, priced,
              tag="", temperature=0.0, **simsd):
    """(row name, B) -> (method, runner): every method at every B; the gamma sweep and the
    ablations as rows of their own; `tag` ends every row's name (" compiled"). simsd: SimSD's
    settings; priced: measure.pricing.price's keyword arguments, for the speculative methods."""
    plan = {}
    for B, m in ((B, m) for B in block_sizes for m in methods):
        base = parse_method(m)[0]
        own = dict(dict(draft_budget=draft_budget) if base == "spiffy" else simsd if base in SIMSD else {}, temperature=temperature)
        own = dict(own, target_dir=target_dir, priced=priced) if base in (*SIMSD, "spiffy") else own
        variants = {m: {}}
        if sweep in SWEPT and base in SIMSD and base not in SWEPT[sweep] and B == block_sizes[0]:
            print(f"--sweep {sweep}: {m} does not read it (one row)")
        if base in DRAFTED and sweep == "gamma":
            variants = {f"{m}(gamma={g})": dict(gamma=g) for g in sorted({1, min(2, B), max(B // 2, 1), B})}
        if base in DRAFTED and sweep == "steps":
            variants = {f"{m}(steps={k})": dict(draft_steps=k) for k in (1, 2, 3, 4, 6)}
        if base in SIMSD and base not in TEMPORAL and sweep == "lookahead":
            variants = {f"{m}(K={k})": dict(lookahead=k) for k in range(4)}
        if base in (*SIMSD, "spiffy") and sweep in PAIRS and base != "simsd-paper":   # (unpriced: one row)
            variants = {m: {}, f"{m}({PAIRS[sweep][0]})": dict(priced=dict(priced, **PAIRS[sweep][1]))}
        if base == "simsd-paper":
            variants |= {f"{m}({name})": setting for a, name, setting in ABLATIONS if a in ablate}
        for name, extra in variants.items():
            plan[(name + tag, B)] = (m, runner(m, tgt, drf, B, graphs, strategy=strategy, **{**own, **extra}))
    return plan


def compare(plan, outputs, results, tasks, exact):
    """Rows with each method against its plain counterpart (same outputs?), a compiled row
    against its eager self too, sdar and plain (speedups measured in this run) -> (rows,
    failures: a lossless method or a compiled row that changed a token, in fp32)."""
    rows, failed = [], []
    for (name, B), (m, run) in plan.items():
        base, threshold = parse_method(m)
        tag = COMPILED * name.endswith(COMPILED)     # compared with its counterpart compiled alike
        plain = ("threshold" if threshold else "plain") + tag
        same = [a == b for a, b in zip(outputs[(name, B)], outputs[(plain, B)])]
        rows.append(dict(method=name, block_size=B, **results[(name, B)], **run.table, same_as=plain,
                         same_fraction=sum(same) / len(same), output_digests=[  # each prompt's tokens: another run compares with them
                             hashlib.sha1(json.dumps(o).encode()).hexdigest()[:8] for o in outputs[(name, B)]]))
        if base in LOSSLESS and exact and not all(same):
            failed.append(f"{name} at B={B} differs from {plain} on {len(same) - sum(same)} prompt(s)")
        eager = name.removesuffix(COMPILED).removesuffix(DRAFTER_COMPILED)
        if eager != name and (eager, B) in outputs:   # compiling must not change a token either
            same = [a == b for a, b in zip(outputs[(name, B)], outputs[(eager, B)])]
            rows[-1]["same_as_eager"] = sum(same) / len(same)
            if exact and not all(same):
                failed.append(f"{name} at B={B} differs from {eager} (eager) on {len(same) - sum(same)} prompt(s)")
    for r in rows:
        base, tag = {m["method"]: m for m in rows if m["block_size"] == r["block_size"]}, COMPILED * r["method"].endswith(COMPILED)
        for ref in ("sdar", "plain", "threshold"):
            r[f"speedup_vs_{ref}"] = vs(r, base.get(ref + tag))
        eager = r["method"].removesuffix(COMPILED).removesuffix(DRAFTER_COMPILED)
        if eager != r["method"]:       # the same method eager, in this run
            r["speedup_vs_eager"] = vs(r, base[eager])
        sdar = base.get("sdar" + tag, dict(target_fwd_per_token=float("nan")))
        r["nfe_reduction_vs_sdar"] = sdar["target_fwd_per_token"] / r["target_fwd_per_token"]
        r["fraction_of_limit"] = r["tokens_per_target_fwd"] / (r["block_size"] * (1 + r["lookahead"]))
        r["stopped_fraction"] = r["stops"].get("stop_id", 0) / len(tasks)   # the rest ran to the limit
    return rows, failed


def main(target=cli.DEFAULT_TARGET, drafter=None, block_sizes=(4,), methods=METHODS,
         prompts=100, max_new_tokens=64, device="cpu", dtype=None, compile=False, attention=None, repeats=1,
         data=None, chat=False, sweep=None, ablate=(), draft_budget=None, out=None, strategy=None,
         gate=None, draft_threshold=None, draft_stop=None, lookahead=None, speed_of_light=None, stop_ids=None, draft_steps=None,
         cost_table=None, lookup_n=None, tasks="arith", max_rows=None, quick=False, batch=None, temperature=0.0):
    """Method flags (drafter ... draft_budget): None/() = the default, an error when no method
    uses them. speed_of_light: a preset or checkpoint directory: measure/sol.py's figures instead."""
    if speed_of_light:
        cli.check_device(device, dtype)
        return sol(speed_of_light, device, getattr(torch, dtype or "float32"), compile, quick=quick, attention=cli.attention(attention, device, compile)) or 0
    simsd_kw = dict(gate=gate, draft_threshold=draft_threshold, draft_stop=draft_stop, lookahead=lookahead, lookup_n=lookup_n, draft_steps=draft_steps)
    methods = [SPECS.get(m, m) for m in methods]     # rows under the names of what they run
    check_args(methods, block_sizes, prompts, max_new_tokens, repeats, device, out, compile, dtype, batch, drafter=drafter,
               sweep=sweep, ablate=ablate or None, draft_budget=draft_budget, **simsd_kw)
    drafted, tag = any(parse_method(m)[0] in DRAFTED for m in methods), TAGS.get(compile)
    attention = cli.attention(attention, device, compile)   # eager and compiled rows alike
    cli.check_max_rows(max_rows, min(block_sizes))
    dtype, limit_hits = getattr(torch, dtype) if dtype else None, RecompileLimitHits() if compile else None
    tgt, tok, drf = cli.load_models(target, (drafter or "") if drafted else None, block_sizes, device, dtype,
                                    not tag and compile, stop_ids, attention)
    pairs = {"": (tgt, drf)} | ({tag: compiled_copies(tgt, drf) if compile == "both" else (tgt, *compiled_copies(drf))}
                                if tag else {})   # the same models again, compiled: both, or the drafter alone
    kind, tasks = tasks, load_tasks(data, prompts, tok, chat, tasks)
    notes = [f"{target} has no chat_template: the prompts are in ChatML"] * (chat and tok.chat_template is None)
    graphs = graphs_for(target, tgt, lambda: calibration_prompts(data, len(tasks), tok, chat, notes), notes)
    cost = {B: costs.cost_model(target, tgt, B, cost_table) for B in block_sizes}
    notes += [f"B={B}: copies sized by {how}" for B, (_, how) in cost.items()]
    methods = list(methods) + [p for p in ("plain", "threshold") if p not in methods and any(
        parse_method(m)[1] == (p == "threshold") for m in methods)]   # each method's plain counterpart runs too
    notes += [f"B={B}: at most {n} rows of copies a verification" for B in block_sizes
              if (n := default_rows(max_rows, device, compile, B))]
    plans = {N: {k: v for end, (t, d) in pairs.items() for k, v in plan_runs(   # a batch of N: its own prices
        [m for m in methods if end != DRAFTER_COMPILED or parse_method(m)[0] in DRAFTED], block_sizes, t, d, graphs, sweep,
        ablate, strategy, draft_budget or DRAFT_BUDGET, target, dict(table=cost_table, max_rows=max_rows, device=device,
        compile=compile, batch=N), end, temperature, **{k: v for k, v in simsd_kw.items() if v is not None}).items()}
        for N in batch or [1]}
    notes, plan = notes + list(dict.fromkeys(r.note for p in plans.values() for _, r in p.values() if r.note)), plans[1]
    cli.warn(*dict.fromkeys(c.stale for c, _ in cost.values() if c))   # a table measured on other code
    head = dict(target=str(target), drafter=str(drafter or cli.DEFAULT_DRAFTER), device=device, torch=torch.__version__, attention=attention,
                tasks=kind, prompts=len(tasks), max_new_tokens=max_new_tokens, repeats=repeats, temperature=temperature, **parallel.describe(tgt))
    if batch:   # many prompts decoded together: rows by batch size
        exact = tgt.embed.weight.dtype == torch.float32 and device == "cpu" and rows_keep_their_bits()   # else a rate
        return report(*by_batch(plans, batch, tasks, max_new_tokens, repeats, device, exact), notes, out, dict(head, batches=batch))
    result, rows, failed, after_warmup = by_block_size(
        plan, block_sizes, tasks, max_new_tokens, tok, repeats, device, lambda name: compile and (
            not tag or name.endswith(tag)), tgt.embed.weight.dtype == torch.float32, out, dict(head, notes=notes))
    print("\n".join([table(rows)] + [f"{r['method']} B={r['block_size']} rounds ended: {r['round_ends']}"
                                     for r in rows if r["round_ends"]] + notes + [f"FAILED: {f}" for f in failed]))
    print(json.dumps(save(out, dict(result, dynamo=limit_hits.report(counters, after_warmup) if compile else {}))))
    return 1 if failed else 0


def by_block_size(plan, block_sizes, tasks, max_new_tokens, tok, repeats, device, compiled, exact, out, head):
    """measure and compare a block size at a time, the JSON saved as each ends (a time-out keeps
    the finished ones). -> (the JSON's dict, rows, failures, graphs compiled after warm-up)."""
    rows, failed, after_warmup = [], [], 0
    for B in block_sizes:
        plan_b = {k: v for k, v in plan.items() if k[1] == B}
        outputs, results, graphs = measure(plan_b, tasks, max_new_tokens, tok, repeats, device, compiled)
        rows_b, failed_b = compare(plan_b, outputs, results, tasks, exact)
        rows, failed, after_warmup = rows + [dict(r, attention=head["attention"]) for r in rows_b], failed + failed_b, after_warmup + graphs
        result = save(out, dict(head, results=rows, lossless_ok=not failed, gpu_model=GPU_MODEL,
                                date=time.strftime("%Y-%m-%d"), complete=B == block_sizes[-1]))
    return result, rows, failed, after_warmup


def save(out, result):
    """result, written to `out` (if given) whole or not at all -> result."""
    if out and not parallel.RANK:   # (under torchrun: rank 0's)
        with util.atomic_write(out) as tmp:
            tmp.write_text(json.dumps(result, indent=1) + "\n")
    return result


def parse_args(argv=None):
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("what to measure")
    g.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated: {', '.join(NAMES)}, "
                   f"or sample.py's --spec names ({', '.join(f'{k} = {v}' for k, v in SPECS.items())}); "
                   f"default {','.join(METHODS)}")
    g.add_argument("--block-size", default="4", help="comma-separated list, e.g. 4,32")
    g.add_argument("--prompts", type=int, default=100, help="held-out problems (or --data lines) to run")
    g.add_argument("--max-new-tokens", type=int, default=64, help="the most tokens a prompt gets")
    g.add_argument("--repeats", type=int, default=1, help="timed passes; wall time is their median")
    g.add_argument("--batch", default=None, help="comma-separated, e.g. 1,4,16: every method decodes all the "
                   "prompts that many at a time (serve/batch.py), a row for each; aggregate tokens/s")
    g.add_argument("--data", default=None, help="GSM8K-format JSONL (question, answer)")
    g.add_argument("--tasks", default="arith", choices=TASKS, help="without --data: held-out problems (arith), "
                   "each after its own worked answer (copy), or open text up to a speaker's line (text)")
    g.add_argument("--quick", action="store_true", help="4 prompts, 32 new tokens: a smoke test (with "
                   "--speed-of-light: the B = 4 forward alone)")
    g.add_argument("--speed-of-light", metavar="MODEL", default=None, help="instead: a random model shaped like "
                   "MODEL (a preset: sdar-8b, or a checkpoint): its forwards against the bandwidth floor (measure/sol.py)")
    cli.model_flags(ap, both=True)
    rule = ap.add_argument_group(f"decoding rule (threshold, +threshold methods: the threshold rule at {cli.THRESHOLD})")
    rule.add_argument("--strategy", default=None, choices=STRATEGIES,
                      help="SDAR strategy for every method without +threshold (default: "
                           "low_confidence_static, one token a step)")
    rule.add_argument("--temperature", type=float, default=0.0, help="every method's, 0 = greedy (every call seeded alike)")
    simsd = cli.simsd_flags(ap, variants=False)
    simsd.add_argument("--sweep", choices=["gamma", "lookahead", "steps", *PAIRS], help="rows for gamma = 1, 2, B/2, B, "
                       "K = 0..3, drafter steps 1, 2, 3, 4, 6, every copy verified (no cost table), or the tables alone (no learning)")
    simsd.add_argument("--ablate", default="", help="simsd-paper without: rope-copy, order (comma-separated)")
    cli.spiffy_flags(ap, graph=False)
    ap.add_argument_group("output").add_argument("--out", default=None, help="also save the JSON here")
    a = vars(ap.parse_args(argv))
    quick, stop_ids = a["quick"], a.pop("stop_ids")
    return dict(a, block_sizes=util.int_list(a.pop("block_size"), "--block-size"), batch=a["batch"] and util.int_list(a["batch"], "--batch"),
                methods=tuple(a["methods"].split(",")), prompts=4 if quick else a["prompts"],
                max_new_tokens=32 if quick else a["max_new_tokens"], ablate=tuple(x for x in a["ablate"].split(",") if x),
                stop_ids=None if stop_ids is None else util.int_list(stop_ids, "--stop-ids"))


if __name__ == "__main__":
    sys.exit(parallel.run(lambda: main(**parse_args())))
