"""Cost tables: how long a verification round (its forward and walk) of so many query rows
takes, for one device, dtype, model shape and block size, measured once by a command
(tools/costs.py) and
saved next to the weights, or, for a model shape with no weights here (SDAR-8B), in
models/costs/<shape>/ (like Spiffy's graphs). The decoders size their copies by it
(fast.sized, through fast.cutter) and never time anything themselves, so the same prompt,
settings and table give the same tokens, forwards and stats on every run. Without a table
every copy a proposer makes is verified (its own budget: --gamma and --lookahead, or D*).

    python tools/costs.py --target models/target            # cost_b{4,8,32}_float32_<this CPU>.json
    python tools/costs.py --target sdar-8b --device cuda --dtype bfloat16 --block-size 4,8,32 \\
        --cache-len 1024                                    # models/costs/sdar-8b/cost_b*_...json

The format, one JSON object a file (a GPU sweep's JSON of rows, seconds, cache_len, dtype,
device, torch and sync_s is a table once model, block_size, code and date are added):
    rows        query rows of each measured forward, increasing (a copy is block_size rows)
    seconds     the fastest forward of that many rows and its walk (the threshold rule stepped
                on every copy: a copy's price is what it adds to the round); positive, never
                less for more rows
    cache_len   rows in the KV cache before each forward
    sync_s      seconds one host sync costs (absent or null on a CPU, where it is about 0)
    device, dtype, model, block_size: the key (key(); device as device_name() writes it,
                "cuda: NVIDIA H200"): a table is used only where all four match
    torch       torch.__version__ it ran on
    code        code_hash() of the code a forward runs: another hash, and the table is stale
    date, target: when, and from what (a checkpoint directory or a PRESETS name)
    draft       optional, SimSD's drafting (measure_draft, tools/costs.py --drafter): drafter (its
                directory), model (its shape), draft_steps; step_s, per blocks drafted ahead
                (0, 1, ...), the seconds of a drafter step: its forward AND its ops (a third of
                it on a CPU); round_s, what a drafted round takes beyond its drafting and its
                copies' price: both fast.gated weighs before the drafter runs
    batch       optional (measure_batch): requests (1, 4, 8, 16), and one_s and two_s, a batched
                round of that many requests with one copy each and with two (costs_in's)
Between two measured row counts a forward costs the straight line between them; past the last,
the last segment's slope; below the first, the first's seconds. A table from before rows has
"copies" (of block_size rows each) in their place and no cache_len (two blocks) or code: it is
read as such, and called stale until it is measured again.
"""
import ast
import bisect
import hashlib
import itertools
import json
import platform
import re
import statistics
import time
from datetime import date
from pathlib import Path

import torch

import mask as masks
from decode import DecodeRule, Session
from loading.checkpoint import PRESETS
from fast import draft_one_sync
from verify import Guesses, verify_copies, walk_one_sync

COPIES = (1, 2, 4, 8, 16)   # the copy counts measured; linear between them and past the last
ROOT = Path(__file__).resolve().parents[1]
SHAPES = ROOT / "models" / "costs"   # tables for a model shape with no weights: SHAPES/<preset>/
CODE = ("model.py", "mask.py", "decode.py", "verify.py", "speculate.py", "fast.py")   # what a measured round runs


def code_hash(root=None):
    """Short sha256 of what CODE runs (code_statements, in sorted order), so a table measured on
    other code is stale, and one measured before a comment, a docstring, an import or the file a
    function lives in changed is not."""
    texts = {name: (Path(root or ROOT) / name).read_text() for name in CODE}
    return hashlib.sha256("\0".join(sorted(code_statements(texts))).encode()).hexdigest()[:12]


def code_statements(texts):
    """Each top-level statement of {file: source} but the imports, rewritten from the syntax tree
    without docstrings or comments (ast.unparse)."""
    parts = []
    for text in texts.values():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                    isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        parts += [ast.unparse(n) for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    return parts


def device_name(device):
    """The device a table is for: the GPU's name, or the CPU's model and torch's thread count."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or "unknown CPU"
    if Path("/proc/cpuinfo").is_file():
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    return f"cpu: {cpu}, {torch.get_num_threads()} threads"


def model_shape(config):
    """The shape a table is for; a mixture of experts names its experts (a dense model's reads
    every weight, an MoE's only the experts routed to: another cost at the same dimensions)."""
    c = config
    experts = f", experts {c.n_experts}/{c.top_k} x {c.moe_intermediate_size}" if c.n_experts else ""
    return (f"{c.n_layer} layers, d {c.n_embd}, heads {c.n_head}/{c.n_kv_head} x {c.head_dim}, "
            f"ffn {c.intermediate_size}, vocab {c.vocab_size}{experts}")


def key(model, B):
    """What a table must match to be used for `model` at block size B."""
    w = model.embed.weight
    return dict(device=device_name(w.device), dtype=str(w.dtype).removeprefix("torch."),
                model=model_shape(model.config), block_size=B)


def table_path(target_dir, model, B):
    """Where the table for `model` at B on this device lives: one file a device, so that the
    tables of several machines can sit next to the same weights."""
    k = key(model, B)
    return Path(target_dir) / f"cost_b{B}_{k['dtype']}_{re.sub('[^a-z0-9]+', '-', k['device'].lower())}.json"


def sync_seconds(device, repeats):
    """The fastest of `repeats` host syncs after one tiny kernel (a result read back and the
    next launch waits: what a decoding round's sync costs), or None on a CPU."""
    if torch.device(device).type != "cuda":
        return None
    x, times = torch.zeros(1, device=device), []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.add_(1).item()
        times.append(time.perf_counter() - t0)
    return min(times[1:])


def measure(model, B, repeats=5, cache_len=None, target=None):
    """Seconds of a round's forward and walk over n = 1, 2, 4, 8, 16 all-mask copies (n x B
    query rows: verify.walk_one_sync steps the threshold rule on every copy, one host sync) after cache_len
    rows of cache (default: two blocks), the fastest of `repeats` each, taken in turns (1, 2,
    ..., 16, 1, 2, ...) so that a slow spell of the machine spreads over every n; more rows are
    never cheaper. -> the table (a dict, the module's format)."""
    device, mask_id = model.embed.weight.device, model.config.mask_token_id
    rule = DecodeRule(mask_id, B, "low_confidence_dynamic", threshold=0.9)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    cache_len = 2 * B if cache_len is None else cache_len
    sess = Session(model, B, cache_len + 17 * B)
    sess.prefill(torch.zeros(cache_len, dtype=torch.long, device=device))
    pos, times = torch.arange(cache_len, cache_len + B, device=device), {n: [] for n in COPIES}
    with torch.no_grad():
        for _ in range(repeats + 1):                                  # the first: a warm-up
            for n in COPIES:
                sync()
                t0 = time.perf_counter()
                g = Guesses(torch.full((n, B), mask_id, device=device), [B] * n)
                walk_one_sync(verify_copies(sess, g, pos), g, 0, rule)
                sync()
                times[n].append(time.perf_counter() - t0)
    seconds = list(itertools.accumulate((min(times[n][1:]) for n in COPIES), max))
    return dict(key(model, B), rows=[n * B for n in COPIES], seconds=seconds, cache_len=cache_len,
                sync_s=sync_seconds(device, repeats), torch=torch.__version__, code=code_hash(),
                date=date.today().isoformat(), target=None if target is None else str(target))


def measure_draft(target, drafter, B, repeats=5, path=None, table=None, new_blocks=8):
    """SimSD's drafting, as it runs: `repeats` prompts of random tokens decoded by
    speculate.simsd_generate (the target verifying, the threshold rule), each call of
    fast.draft_one_sync timed where it runs, between the target's forwards (experiments/gate_ab.py sets
    it against one timed back to back), and by plain decoding, timed whole: its rounds put the
    times in `table`'s time base (a shared machine is faster or slower by the minute). -> the
    table's "draft": per blocks drafted ahead, 0 to LOOKAHEAD, the median drafter step (its
    cache catching up on the blocks the last round finished: most calls), and round_s, the median
    of what a drafted round took beyond its drafting and `table`'s price of its copies."""
    from decode import generate
    from speculate import LOOKAHEAD, Settings, simsd_generate
    device, c, cost = drafter.embed.weight.device, target.config, cost_of(table) if table else None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rule = DecodeRule(c.mask_token_id, B, "low_confidence_dynamic", threshold=0.9)
    times, rounds, plain = {}, [], []         # drafter steps by ahead; drafted and plain rounds

    def timed(sess, front, rule, s, ahead, stops, generator=None):
        sync()
        t0 = time.perf_counter()
        d = draft_one_sync(sess, front, rule, s, ahead, stops, generator)
        sync()
        steps = min(s.draft_steps, front.n_masked + ahead * B)
        times.setdefault(ahead, []).append((time.perf_counter() - t0) / steps)
        rounds.append([t0, time.perf_counter() - t0, 1])   # began, drafting, copies (cut's)
        return d

    def counted(g):
        rounds[-1][2] = len(g.n_masked)
        return g
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for i in range(repeats + 1):                      # the first: a warm-up
            prompt = [t for t in torch.randint(c.vocab_size, (3 * B,), generator=g).tolist()
                      if t != c.mask_token_id][:2 * B]
            rounds.append(None)                           # (no round spans two prompts)
            simsd_generate(target, drafter, prompt, new_blocks * B, rule,
                           Settings(draft=timed, cut=counted), eos_id=-1)
            t0 = time.perf_counter()
            run = generate(target, prompt, new_blocks * B, rule, eos_id=-1)[1]
            plain.append((time.perf_counter() - t0 - cost(2)) / (run["nfe"] - 1) if cost else 0)
            if i == 0:
                times.clear(), rounds.clear(), plain.clear()
    scale = cost(1) / statistics.median(plain) if cost else 1.0     # -> the table's time base
    seen = {a: scale * statistics.median(x) for a, x in times.items()}   # (an `ahead` never met:
    steps = [seen[min(seen, key=lambda b: abs(a - b))] for a in range(LOOKAHEAD + 1)]   # nearest)
    rest = [scale * (b[0] - a[0] - a[1]) - cost(a[2]) for a, b in zip(rounds, rounds[1:]) if a and b]
    return dict(drafter=None if path is None else str(path), model=model_shape(drafter.config),
                draft_steps=Settings().for_block(B).draft_steps, step_s=steps,
                round_s=max(0.0, statistics.median(rest)) if cost and rest else 0.0)


BATCH = (1, 4, 8, 16)   # the requests a batched round is measured at (linear between them)


def measure_batch(model, B, repeats=5, cache_len=None):
    """A batched round as serve/batch.py runs one: ONE packed forward of N = 1, 4, 8, 16
    requests, each with one all-mask copy, or two, then each request's walk; the fastest of
    `repeats`, taken in turns. -> the table's "batch": requests, one_s, two_s."""
    from serve.batch import Call, Pool, Slot
    device, mask_id = model.embed.weight.device, model.config.mask_token_id
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rule = DecodeRule(mask_id, B, "low_confidence_dynamic", threshold=0.9)
    cache_len = 2 * B if cache_len is None else cache_len
    start, pool = torch.tensor(cache_len), Pool(model, max(BATCH))
    pool.reserve(cache_len + 2 * B)
    sees = torch.eye(16, dtype=torch.bool, device=device)          # each copy sees itself
    times = {(N, n): [] for N in BATCH for n in (1, 2)}
    with torch.no_grad():
        for _ in range(repeats + 1):                              # the first: a warm-up
            for N, n in times:
                g = Guesses(torch.full((n, B), mask_id, device=device), [B] * n)
                mask = masks.block_copies(start, torch.tensor(0), B, sees)
                calls = [Call(Slot(model, pool, i, None), g.copies.flatten(), torch.arange(
                    cache_len, cache_len + B, device=device).repeat(n), cache_len, mask, n * B, None)
                    for i in range(N)]
                sync()
                t0 = time.perf_counter()
                for logits in pool.forward(calls):
                    walk_one_sync(logits[0], g, 0, rule)
                sync()
                times[N, n].append(time.perf_counter() - t0)
    best = {k: min(x[1:]) for k, x in times.items()}
    return dict(requests=list(BATCH), one_s=[best[N, 1] for N in BATCH],
                two_s=[max(best[N, 2], best[N, 1]) for N in BATCH])


def costs_in(cost, N):
    """cost (cost_of's) as one request of a batch of N sees it: its share of a batched round
    of one copy each, and each copy more what it adds to that round (the table's "batch"),
    so that a request's copies are bought at the price the batch pays for them. Drafting keeps
    its solo price (the drafter's forward is shared too: an upper bound). N = 1 or no "batch"
    measured: cost itself."""
    b = (getattr(cost, "table", None) or {}).get("batch")
    if N == 1 or not b:
        return cost
    one, two = (seconds_at(dict(rows=b["requests"], seconds=b[k]), N) for k in ("one_s", "two_s"))

    def cost_n(n):
        return (one + (n - 1) * (two - one)) / N
    cost_n.table, cost_n.drafting, cost_n.batch, cost_n.solo = cost.table, cost.drafting, N, cost
    cost_n.path, cost_n.stale = getattr(cost, "path", None), getattr(cost, "stale", None)
    return cost_n


def seconds_at(table, rows):
    """The seconds a forward of `rows` query rows takes by `table`: linear between its row
    counts, the last slope past them, the first's seconds below them."""
    rs, ts = table["rows"], table["seconds"]
    rows = max(rows, rs[0])
    i = min(max(bisect.bisect_left(rs, rows), 1), len(rs) - 1)     # the segment rows is on (or past)
    return ts[i - 1] + (ts[i] - ts[i - 1]) * (rows - rs[i - 1]) / (rs[i] - rs[i - 1])


def cost_of(table):
    """A table -> cost(n copies) -> seconds (a copy: block_size rows); cost.drafting: the
    table's "draft" (SimSD's drafting priced), or None (not measured)."""
    def cost(n):
        return seconds_at(table, n * table["block_size"])
    cost.table, cost.drafting = table, table.get("draft")
    return cost


def drafting(cost, drafter, target=None):
    """`cost`'s table's "draft" (fast.gated's prices) if it timed a drafter of this one's shape;
    else, given the target, a stated model ("stated": its ratio; a lower bound where per-layer latency
    counts): a drafter step costs the target's solo forward of the same rows times the ratio of their
    active parameters; else None (drafting free)."""
    d = getattr(cost, "drafting", None)
    if cost is None or drafter is None:
        return None
    if d and d["model"] == model_shape(drafter.config):
        return d
    if target is None:
        return None
    ratio, solo = active_params(drafter) / active_params(target), getattr(cost, "solo", cost)   # (costs_in)
    return dict(step_s=[ratio * solo(1 + k) for k in range(4)], round_s=0.0, stated=ratio)


def active_params(model):
    """The parameters one token's forward uses: a mixture of experts' top_k of its experts, and no
    input embedding but a tied one (an untied one is a lookup)."""
    c, total = model.config, sum(p.numel() for p in model.parameters())
    total -= 0 if c.tie_embeddings else model.embed.weight.numel()
    experts = sum(p.numel() for b in model.layers if c.n_experts and hasattr(b.mlp, "router")
                  for p in (b.mlp.gate, b.mlp.up, b.mlp.down))
    return total - experts * (1 - c.top_k / c.n_experts) if experts else total


def flat(B):
    """A flat cost model (--cost-table flat): every forward the same, rows free, drafting free,
    as rows nearly are on a GPU: the cut then keeps every copy a positive reach reaches (a
    method whose rounds walk at most fast.MARGIN steps still runs the rule alone)."""
    cost = cost_of(dict(block_size=B, rows=[B, 2 * B], seconds=[1.0, 1.0]))
    cost.path, cost.stale = "flat", None
    return cost


def read_table(path):
    """A cost table file, checked: readable JSON with the key, increasing row counts and
    positive, non-decreasing seconds (a table from before rows: copies read as rows). -> the
    table, with rows and cache_len."""
    try:
        t = json.loads(Path(path).read_text())
        if "rows" not in t and "copies" in t:         # the format before rows: two blocks of cache
            t = dict(t, rows=[n * t["block_size"] for n in t["copies"]], cache_len=2 * t["block_size"])
        rs, ts = t["rows"], t["seconds"]
        ok = (len(rs) == len(ts) >= 2 and all(type(n) is int for n in rs) and rs == sorted(set(rs))
              and rs[0] >= 1 and all(isinstance(x, (int, float)) and x > 0 for x in ts) and ts == sorted(ts)
              and all(type(t[k]) is int and t[k] >= 0 for k in ("block_size", "cache_len"))
              and ("draft" not in t or isinstance(t["draft"]["model"], str) and t["draft"]["step_s"]
                   and all(x > 0 for x in t["draft"]["step_s"]))
              and ("batch" not in t or all(len(t["batch"][k]) == len(t["batch"]["requests"]) > 0
                                           for k in ("one_s", "two_s"))))
        if not ok or not all(isinstance(t.get(k), str) for k in ("device", "dtype", "model")):
            raise ValueError
    except OSError as e:
        raise ValueError(f"cost table {path} cannot be read ({e.strerror or type(e).__name__})") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"malformed cost table {path}: it needs device, dtype, model, block_size, "
                         "rows (increasing counts), seconds (positive, non-decreasing) and "
                         "cache_len") from None
    return t


def remeasure(table, path):
    """The command that measures `table` (found at `path`) again, on this code."""
    folder = Path(path).parent
    target = table.get("target") or str(folder)
    out = SHAPES / target if target in PRESETS else Path(target)
    B, cache_len = table["block_size"], table["cache_len"]
    return (f"python tools/costs.py --target {target}" + f" --out {folder}" * (out.resolve() != folder.resolve())
            + f" --block-size {B}" + f" --cache-len {cache_len}" * (cache_len != 2 * B)
            + f" --device {table['device'].split(':')[0]} --dtype {table['dtype']}"
            + f" --drafter {(table.get('draft') or {}).get('drafter')}" * bool(table.get("draft")))


def stale(table, path):
    """None if `table` was measured on the code here (its code hash), else the one-line warning
    the command lines print (decoding still uses it: its counts stay a function of the inputs)."""
    now = code_hash()
    if table.get("code") == now:
        return None
    return (f"warning: cost table {path} was measured on other code (hash "
            f"{table.get('code') or 'none kept'} != {now}): re-measure with {remeasure(table, path)}")


def cost_from(table, path):
    """cost_of(table), saying where it came from (cost.path) and whether it is stale
    (cost.stale: stale's warning, or None)."""
    cost = cost_of(table)
    cost.path, cost.stale = str(path), stale(table, path)
    return cost


def named(cost):
    """What a bench row records of its cost model: the table's file (None: no table) and
    whether it was measured on other code."""
    return dict(cost_table=getattr(cost, "path", None), cost_table_stale=bool(getattr(cost, "stale", None)))


def load(path, model, B):
    """The cost model in `path` for `model` at block size B, refused (one line naming the file and
    what differs) when it was measured for another device, dtype, model shape or block size."""
    t = read_table(path)
    for k, want in key(model, B).items():
        if t.get(k) != want:
            raise ValueError(f"cost table {path} was measured for {k} {t.get(k)!r}, not {want!r}")
    return cost_from(t, path)


def find(target_dir, model, B):
    """The table next to the weights, if there is one for this device, dtype, model and B.
    -> (cost model or None, in words: which)."""
    path = table_path(target_dir, model, B)
    if not path.is_file():
        others = [p.name for p in sorted(path.parent.glob(f"cost_b{B}_{key(model, B)['dtype']}_*.json"))]
        none = f"no cost table for this device (there: {', '.join(others)})" if others else "no cost table"
        return None, f"{none}; every copy verified (python tools/costs.py --target {target_dir})"
    t = read_table(path)
    if any(t.get(k) != v for k, v in key(model, B).items()):
        return None, f"no cost table for this device ({path.name} is for {t.get('device')})"
    cost = cost_from(t, path)
    return cost, f"cost table {path.name} ({t.get('date')}{', stale' * bool(cost.stale)})"


def cost_model(target_dir, model, B, table=None, batch=1):
    """The cost model copies are sized by at block size B: the cost table `table` (refused if it
    is for another device, dtype, model or B), else the one next to the target's weights for
    this device, if any (costs.py); in a batch of N > 1, as one request of it sees it (costs_in).
    -> (cost or None: every copy verified, in words: which); cost.stale: the warning to print
    when the table was measured on other code."""
    if table == "none":
        return None, "no cost table (--cost-table none): every copy verified"
    if table == "flat":
        return flat(B), "a flat cost table (--cost-table flat: every forward alike, drafting free)"
    if table is None:
        cost, words = find(target_dir, model, B)
    else:
        cost = load(table, model, B)
        words = f"cost table {table} ({cost.table.get('date')}{', stale' * bool(cost.stale)})"
    if batch == 1 or cost is None or "batch" not in cost.table:
        return cost, words
    return costs_in(cost, batch), words + f", a request's share in a batch of {batch}"
