"""What the command lines share (sample.py, bench.py, tools/harness.py, spiffy.py, measure/sol.py,
train.py): loading a checkpoint (and a drafter that fits it), the decoding rule, compiling, and
the flags, grouped as --help shows them, each default defined once and each flag checked before
any file is read. Imports point down: this module imports the decoders, none of them imports it.
"""
import copy
import logging
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from loading import checkpoint
from loading import util
import mask as masks
import fast
from decode import EB_THRESHOLD, STRATEGIES, DecodeRule, Session
import variants
from speculate import DRAFT_STOP, DRAFT_THRESHOLD, LOOKAHEAD, Settings
from variants import ACCEPTS, GATE, LOOKUP_N, REFERENCES
from spiffy import DRAFT_BUDGET
from loading.tokenizer import check_same_tokenizer, load_tokenizer
from measure import costs, reach

ROOT = Path(__file__).parent
DEFAULT_TARGET, DEFAULT_DRAFTER = ROOT / "models/target", ROOT / "models/drafter"
# The one default decoding rule, for every method: the threshold rule (low_confidence_dynamic)
# at 0.9, the fastest plain rule measured here (README), so that `--spec none` and `--spec
# simsd` compare the same rule. `--strategy low_confidence_static` is SDAR's one token a step.
THRESHOLD = 0.9
COMPILE_MODES = (*fast.MODEL_COMPILES, "drafter")       # --compile: both models so, or the drafter alone
DTYPES = ("float32", "bfloat16", "float16")
GPU_ROWS = 256   # max_rows' default on a GPU
MAX_BUCKET = 16  # static shapes: by default, queries of at most 16 blocks (at most fast.STATIC_ROWS rows)
ATTENTIONS = ("flex", "sdpa")   # --attention: FlexAttention (a BlockMask) or SDPA (a dense mask)



def load(path, device="cpu", dtype=None, stop_ids=None):
    """A checkpoint directory -> (model, tokenizer). Decoding stops at every id the checkpoint
    lists (config.json's and generation_config.json's eos_token_id) and at the tokenizer's
    EOS, or at `stop_ids` when given (model.config.stop_ids)."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    model = checkpoint.from_pretrained(path, device=device, dtype=dtype or saved_dtype(path))
    c = model.config
    tok = load_tokenizer(path, mask_id=c.mask_token_id)
    if tok.vocab_size > c.vocab_size:
        raise ValueError(f"{path}: tokenizer has {tok.vocab_size} ids, the model only {c.vocab_size}")
    listed = [*(c.stop_ids or [c.eos_token_id]), *([tok.eos_id] if tok.eos_id is not None else [])]
    for i in stop_ids or ():
        if not 0 <= i < tok.vocab_size or i == c.mask_token_id:
            raise ValueError(f"--stop-ids: {i} is not a token id of {path}'s vocabulary "
                             f"(0..{tok.vocab_size - 1}, the mask token {c.mask_token_id} excepted)")
    stops = tuple(dict.fromkeys(listed if stop_ids is None else stop_ids))
    c.stop_ids = () if stops == (c.eos_token_id,) else stops    # (): eos_token_id alone
    return model, tok


def saved_dtype(path):
    """The dtype a checkpoint was published in (config.json's torch_dtype, or transformers 5's
    dtype: bfloat16 for SDAR), the default of --dtype; float32 where it names none."""
    hf = util.read_json(Path(path) / "config.json")
    name = hf.get("torch_dtype") or hf.get("dtype")
    return getattr(torch, name) if name in DTYPES else torch.float32


def attention(name, device, compile):
    """--attention for both models and both sides of every compiled-vs-eager comparison: as
    given, else flex where compiled on CUDA, else SDPA (faster on a CPU, eager or compiled:
    docs/results.md). Flex stays the compiled CUDA default until a GPU run shows which kernel
    is exact and faster there: it is the one the only GPU run so far (2026-12-04) compiled."""
    if name is not None and name not in ATTENTIONS:
        raise ValueError(f"unknown --attention {name!r}; choose from {', '.join(ATTENTIONS)}")
    return name or ("flex" if compile and torch.device(device).type == "cuda" else "sdpa")


def set_attention(name, *models):
    """Every model (None skipped) attends with `name` (ATTENTIONS), eager or compiled."""
    for m in models:
        if m is not None and name is not None:
            m.attn_impl = name


def max_rows(rows, device, compile, block_size):
    """The most query rows of a verification's copies: --max-rows, else on a GPU or with static
    shapes the largest compiled bucket but the pending block's, at most GPU_ROWS (a copy past
    it costs compute, not only weight reads: an SDAR-8B forward in bf16 on an H200 is
    memory-bound up to about 200 rows); None (no cap) on a CPU."""
    if rows is not None or not (torch.device(device).type == "cuda" or compile == "static"):
        return rows
    return min(GPU_ROWS, (MAX_BUCKET - 1) * block_size)


def load_drafter(path, target, tok, block_sizes, device="cpu", dtype=None):
    """SimSD's drafter, checked against its target: the same tokenizer, vocabulary and mask
    token, and trained for every block size it will draft at."""
    drafter, draft_tok = load(path or DEFAULT_DRAFTER, device, dtype)
    check_same_tokenizer(draft_tok, tok)
    for B in block_sizes:
        check_block_size(drafter, B, "drafter")
    if (drafter.config.vocab_size, drafter.config.mask_token_id) != \
            (target.config.vocab_size, target.config.mask_token_id):
        raise ValueError("drafter and target differ in vocabulary size or mask token id")
    return drafter


def drafter_gate(cost, drafter, target_dir, rule, verifier=None, acceptance=None, **_):
    """SimSD's drafter loop as the command lines run it: fast.draft, in a lossless round on
    copies or a round on the temporal mask gated (fast.gated) by the cost table's drafting and
    the reach table's means a round, so that it runs only where it is expected to pay."""
    temporal = verifier == "temporal"
    if drafter is None or not temporal and acceptance not in (None, "lossless"):
        return fast.draft
    return fast.gated(fast.draft, cost, costs.drafting(cost, drafter),
                      reach.per_round(target_dir, reach.method_of("simsd", None, verifier), rule))


def rule_alone(cost, target_dir, method, rule, drafter=None):
    """None, or why `method` (measure/reach.METHODS) runs as the rule alone at this block size on
    this device: its rounds would pay in none (fast.pays on the reach table's means a round),
    even proposing at its cheapest (with a drafter: one step of its at the table's price;
    without: free)."""
    per_round = None if cost is None else reach.per_round(target_dir, method, rule)
    if per_round is None:
        return None
    d = costs.drafting(cost, drafter) or dict(step_s=[0.0])
    if fast.pays(cost, per_round, min(d["step_s"]) + d.get("round_s", 0.0)):
        return None
    batch = f" in a batch of {cost.batch}" if getattr(cost, "batch", 1) > 1 else ""
    return (f"B={rule.block_size} {method}: its rounds would not pay here{batch} ({per_round[0]:.2f} "
            f"steps a round for {per_round[1]:.2f} copies, by the cost and reach tables): the rule alone")


def simsd_drafter(target, drafter, reference, model, tok, block_size, device="cpu", dtype=None):
    """SimSD's drafter for --reference (None: drafter), or None for a drafter-free reference;
    with neither --drafter nor --reference, the embedded drafter for the embedded target only."""
    if reference not in (None, "drafter"):
        return None
    if drafter is None and Path(target).resolve() != DEFAULT_TARGET.resolve():
        raise ValueError(f"--spec simsd needs reference tokens for {target}: give --drafter DIR (a "
                         "smaller model of its vocabulary), or --reference trajectory or lookup (none)")
    return load_drafter(drafter, model, tok, [block_size], device, dtype)


def load_models(target, drafter, block_sizes, device="cpu", dtype=None, compile=None, stop_ids=None,
                attention="sdpa"):
    """-> (target, tokenizer, drafter or None when `drafter` is None), each checked for every
    block size, attending with `attention` and compiled on request (drafter "": the default one)."""
    tgt, tok = load(target, device, dtype, stop_ids)
    for B in block_sizes:
        check_block_size(tgt, B, "target")
    drf = None if drafter is None else load_drafter(drafter, tgt, tok, block_sizes, device, dtype)
    compile_models(tgt, drf, compile, attention)
    return tgt, tok, drf


def compile_models(target, drafter, how, attention=None):
    """Both models attend with `attention` (None: as they are; ATTENTIONS), eager and compiled.
    --compile `how` for both models (drafter None: none), or "drafter": the drafter alone,
    "auto" (on a CPU its forward then costs about a fifth of the eager target's, against
    about a third eager: docs/history.md, "The drafter compiled alone")."""
    set_attention(attention, target, drafter)
    if how == "drafter":
        if drafter is None:
            raise ValueError("--compile drafter: this method runs no drafter (--spec simsd with one does)")
        return fast.compile_model(drafter, "auto")
    for m in (target, drafter) if how else ():
        if m is not None:
            fast.compile_model(m, how)


def compiled_copies(*models):
    """--compile both: a copy of each model (None stays None), compiled ("auto"), with its own
    cache and graphs but the original's weights (one copy of an 8B model's weights on a GPU)."""
    copies = [m and copy.deepcopy(m, memo={id(p): p for p in m.parameters()}) for m in models]
    for m in filter(None, copies):
        fast.compile_model(m, "auto")
    return copies


def warm_up(runs, prompts, max_new_tokens, block_size, target, drafter=None, max_blocks=2):
    """Compile before anything is timed. Each model's KV cache is sized first, once for the
    process (a cache of another size is new graphs): room for the longest prompt, the
    generation and every decoder's scratch rows. A compiled model runs a forward of each graph
    decoding can reach (warm_buckets: every bucket with static shapes, the target's up to
    max_blocks blocks and the drafter's up to 2; every mask kind with dynamic ones), which a
    later prompt could reach first. Then each of `runs` (ids, n -> decoding) decodes the
    shortest and the longest prompt. -> (seconds, graphs compiled), printed."""
    t0, graphs = time.perf_counter(), counters["stats"]["unique_graphs"]
    ends = sorted(prompts, key=len)
    for model, blocks, kinds in ((target, max_blocks, ("plain", "copies", "ahead", "temporal")),
                                 (drafter, 2, ("plain",))):
        if model is None:
            continue
        # scratch: SimSD's default copies (4 B drafts over 4 blocks), 3 blocks more, static padding
        model.setup_cache(len(ends[-1]) + max_new_tokens + (4 * block_size + 7 + MAX_BUCKET) * block_size)
        if fast.is_compiled(model):
            warm_buckets(model, block_size, blocks, kinds)
    for run in runs:
        for ids in [ends[0]] + [ends[-1]] * (len(ends) > 1):
            run(ids, max_new_tokens)
    seconds, graphs = time.perf_counter() - t0, counters["stats"]["unique_graphs"] - graphs
    print(f"warm-up: {seconds:.1f} s, {graphs} graph(s) compiled")
    return seconds, graphs


@contextmanager
def eager(*models):
    """Inside the block, the models run eager: what fast.compile_static or compile_dynamic
    installed set aside."""
    back = [fast.eager_again(m) for m in models if m is not None]
    try:
        yield
    finally:
        for put_back in back:
            put_back()


def check_compiled(decode, *models):
    """Compiling must not change a token: decode() -> ids, compiled and then eager. In fp32 a
    difference is an error; in bf16 or fp16 (where a forward of another shape may round a
    near-tie the other way) a warning. Compiled decoding on CUDA is known to differ today
    (README, "The GPU check"; tests/test_cuda.py)."""
    compiled = decode()
    with eager(*models):
        plain = decode()
    if compiled == plain:
        return
    where = next(i for i, (a, b) in enumerate(zip(compiled + [None], plain + [None])) if a != b)
    msg = f"compiled decoding gave other tokens than eager from token {where} on"
    if models[0].embed.weight.dtype == torch.float32:
        raise ValueError(msg + "; run without --compile")
    print(f"warning: {msg} (in {models[0].embed.weight.dtype} a near-tie may round either way)",
          file=sys.stderr)


def verified_blocks(block_size, max_rows):
    """The most blocks of queries a verification forward carries: the pending block and its
    copies (MAX_BUCKET without a cap)."""
    return MAX_BUCKET if max_rows is None else min(MAX_BUCKET, 1 + max_rows // block_size)


@torch.no_grad()
def warm_buckets(model, B, max_blocks, kinds=("plain",)):
    """A forward of each graph decoding can reach. Static shapes: one graph a query-row bucket,
    whatever the mask (fast.padded): 1, 2, 4, ... blocks, up to the one max_blocks needs.
    Dynamic shapes: one graph a mask kind (plain, copies, copies of the next block, temporal),
    whatever the length: one forward of three blocks each."""
    mask_id, device = model.config.mask_token_id, model.embed.weight.device
    sees = torch.ones(16, 16, dtype=torch.bool, device=device).tril()
    step, slot = torch.arange(2 * B, device=device), torch.arange(2 * B, device=device) >= B
    mask_of = dict(plain=lambda prefix, _: masks.block_causal(B, prefix),
                   copies=lambda prefix, n_commit: masks.block_copies(prefix, n_commit, B, sees.diag().diag()),
                   ahead=lambda prefix, n_commit: masks.block_copies(prefix, n_commit, B, sees),
                   temporal=lambda prefix, n_commit: masks.simsd_temporal(prefix, n_commit, step, slot))
    static = "forward" in vars(model)
    sess, blocks = Session(model, B, (2 * MAX_BUCKET + 1) * B), [1 << i for i in range(MAX_BUCKET.bit_length())]
    for n, kind in [(n, "plain") for n in blocks if n < 2 * max_blocks] if static else [(3, k) for k in kinds]:
        tokens = torch.full((n * B,), mask_id, device=device)
        sess.committed = B
        sess.forward(tokens, torch.arange(B, B + len(tokens), device=device), mask_of[kind], keep=B)


def describe(rule):
    """A DecodeRule in words, for summary lines: "threshold rule 0.9, B=4, greedy"."""
    name = {"low_confidence_dynamic": f"threshold rule {rule.threshold:g}",
            "low_confidence_static": "one token a step" if rule.steps == rule.block_size
            else f"{rule.steps} steps a block",
            "entropy_bounded": f"entropy_bounded {rule.eb_threshold:g}"}.get(rule.strategy, rule.strategy)
    sampled = f", temperature {rule.temperature:g}" if rule.temperature else ", greedy"
    return f"{name}, B={rule.block_size}{sampled}"


def make_rule(model, block_size=None, threshold=None, temperature=0.0, top_k=None, top_p=None,
              steps=None, strategy=None, eb_threshold=EB_THRESHOLD):
    """A DecodeRule: SDAR's static one token per step by default, the threshold rule
    (low_confidence_dynamic) when a threshold is given, or another of SDAR's strategies."""
    if threshold is not None and strategy not in (None, "low_confidence_dynamic"):
        raise ValueError(f"--threshold applies to the threshold rule, not --strategy {strategy}")
    strategy = strategy or ("low_confidence_dynamic" if threshold else "low_confidence_static")
    B = block_size or model.config.block_size
    return DecodeRule(model.config.mask_token_id, B, strategy=strategy, steps=steps,
                      threshold=THRESHOLD if threshold is None else threshold,
                      eb_threshold=eb_threshold, temperature=temperature, top_k=top_k, top_p=top_p)


def default_threshold(threshold, strategy):
    """The command lines' rule: --threshold, else --strategy, else the threshold rule at THRESHOLD."""
    return THRESHOLD if threshold is None and strategy is None else threshold


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

    def report(self, counters, after_warmup):
        """Printed and returned: graphs compiled in all and after the warm-up (compiles the
        timed runs paid for), and limit hits (part of the "compiled" run was eager)."""
        logging.getLogger("torch._dynamo").removeHandler(self)
        dynamo = dict(unique_graphs=counters["stats"]["unique_graphs"],
                      graphs_after_warmup=after_warmup,
                      recompile_limit_hits=len(self.hits))
        print(f"torch.compile: {dynamo}")
        if self.hits:
            print(f"WARNING: {self.hits[0]}: part of the 'compiled' run was eager")
        return dynamo


# ---- checks: every flag before any file is read, in one line each

def warn(*lines):
    """Print each line given on stderr (None or "": none): what a run should know, not stop for
    (a cost table measured on other code: costs.stale)."""
    for line in filter(None, lines):
        print(line, file=sys.stderr)


def check_block_size(model, block_size, name):
    supported = model.config.block_sizes or (model.config.block_size,)
    if block_size not in supported:
        raise ValueError(f"{name} was trained for block size(s) {list(supported)}, not {block_size}")


def check_device(device, dtype=None):
    """A device this code runs on (cpu or cuda), a GPU when one is asked for, and a --dtype it
    can run (check_dtype)."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown --device {device!r}; use cpu or cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device} is not supported; use cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but no GPU is available")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: there are only {torch.cuda.device_count()} GPU(s)")
    if dev.type == "cuda" and dev.index is not None:   # flex attention's kernels run on the
        torch.cuda.set_device(dev)                      # current device
    check_dtype(device, dtype)


def check_dtype(device, dtype):
    """A --dtype the device can run (None: the checkpoint's own)."""
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown --dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if dtype == "bfloat16" and torch.device(device).type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--dtype bfloat16: {torch.cuda.get_device_name(device)} cannot run it; "
                         "use float16 or float32")


def check_max_rows(rows, block_size):
    """--max-rows: at least one block (of --block-size, when given; the checkpoint's is checked
    by the decoders)."""
    if rows is not None and rows < (block_size or 1):
        raise ValueError(f"--max-rows {rows} is below one block ({block_size or 1} rows)")


def check_used(methods, chosen, owners, **given):
    """Refuse a flag given explicitly (not None) that none of `methods` reads; owners: flag ->
    the methods that read it; chosen: how the user picked the methods, for the message."""
    for name, value in given.items():
        if value is not None and not set(methods) & set(owners[name]):
            raise ValueError(f"--{name.replace('_', '-')} does nothing with {chosen} (it is for "
                             f"{', '.join(owners[name])})")


def check_unit(**values):
    """Confidences and probabilities: each None or in (0, 1]."""
    for name, x in values.items():
        if x is not None and not 0 < x <= 1:
            raise ValueError(f"--{name.replace('_', '-')} must be in (0, 1], got {x}")


def check_rule(threshold, temperature, top_p, eb_threshold):
    check_unit(threshold=threshold, top_p=top_p)
    if not eb_threshold > 0:
        raise ValueError(f"--eb-threshold must be > 0, got {eb_threshold}")
    if not temperature >= 0:  # (NaN fails too)
        raise ValueError(f"--temperature must be >= 0, got {temperature}")


SIMSD_FLAGS = ("drafter", "gamma", "verifier", "acceptance", "gate", "draft_steps", "draft_threshold",
               "draft_stop", "lookahead", "reference", "lookup_n")
VERIFIERS = ("temporal", "copies")
SPIFFY_FLAGS = ("graph", "draft_budget")
SPEC_FLAGS = ("cost_table", "max_rows")   # both speculative methods


def check_spec_flags(spec, block_size=None, **flags):
    """sample.py's and tools/harness.py's method flags: SIMSD_FLAGS for simsd, SPIFFY_FLAGS for
    spiffy (None: that method's default), each refused by the other methods."""
    util.check_positive(gamma=flags["gamma"], draft_budget=flags["draft_budget"],
                        draft_steps=flags.get("draft_steps"))
    check_max_rows(flags.get("max_rows"), block_size)
    check_unit(gate=flags["gate"], draft_threshold=flags["draft_threshold"], draft_stop=flags["draft_stop"])
    owners = {k: ["simsd"] for k in SIMSD_FLAGS} | {k: ["spiffy"] for k in SPIFFY_FLAGS} | {
        k: ["simsd", "spiffy"] for k in SPEC_FLAGS}
    shown = {"verifier": "verify", "acceptance": "accept"}    # the flags' names on the command line
    check_used([spec], f"--spec {spec}", {shown.get(k, k): v for k, v in owners.items()},
               **{shown.get(k, k): v for k, v in flags.items()})
    if flags["gate"] is not None and (flags["acceptance"] or "gated") != "gated":
        raise ValueError(f"--gate does nothing with --accept {flags['acceptance']} (it is for gated)")
    if spec == "simsd":
        temporal = flags["verifier"] == "temporal"
        lookahead = (0 if temporal else LOOKAHEAD) if flags["lookahead"] is None else flags["lookahead"]
        Settings(flags["verifier"] or "copies", lookahead, flags["gamma"], flags.get("draft_steps"),
                 flags["draft_threshold"], flags["draft_stop"]).check()
        variants.check(temporal, flags["acceptance"] or "lossless", flags["reference"] or "drafter",
                       LOOKUP_N if flags["lookup_n"] is None else flags["lookup_n"], flags["gate"])
        check_reference_flags(**{k: flags.get(k) for k in ("reference", "lookup_n", "drafter", "draft_threshold",
                                                           "draft_stop", "gamma", "draft_steps")})


def check_reference_flags(reference, lookup_n, **drafter_flags):
    """--reference's own flags: --lookup-n for lookup, the drafter's for the drafter."""
    if lookup_n is not None and reference != "lookup":
        raise ValueError(f"--lookup-n does nothing with --reference {reference or 'drafter'} (it is for lookup)")
    for name, value in drafter_flags.items() if reference not in (None, "drafter") else ():
        if value is not None:
            raise ValueError(f"--{name.replace('_', '-')} does nothing with --reference {reference} "
                             "(it is for a drafter)")


# ---- flags, in the groups --help shows

def model_flags(ap, both=False):
    """both: --compile both too (bench.py: every method eager and compiled, in one run)."""
    g = ap.add_argument_group("model")
    g.add_argument("--target", default=str(DEFAULT_TARGET), help="target checkpoint directory (HF layout)")
    g.add_argument("--drafter", default=None, help="simsd: drafter checkpoint (default models/drafter)")
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    g.add_argument("--dtype", default=None, choices=DTYPES, help="weights' dtype (default: the "
                   "checkpoint's own, config.json's torch_dtype; float32 where it names none)")
    g.add_argument("--max-rows", type=int, default=None, help="simsd, spiffy: the most query rows "
                   f"of a verification's copies (default on a GPU: the largest compiled bucket, at "
                   f"most {GPU_ROWS}; on a CPU: no cap)")
    g.add_argument("--compile", nargs="?", const="auto", choices=COMPILE_MODES + ("both",) * both,
                   help="torch.compile the models: static shapes and CUDA graphs on CUDA, dynamic "
                        "shapes on the CPU (auto), or say which; drafter: the drafter alone (auto)" + both * ", a row with it eager "
                        "and one compiled; both: a row eager and a row compiled (auto) for every method, interleaved "
                        "prompt by prompt")
    g.add_argument("--attention", default=None, choices=ATTENTIONS, help="flex: FlexAttention; "
                   "sdpa: scaled_dot_product_attention with a dense mask; the same eager and "
                   "compiled (default: flex compiled on CUDA, else sdpa)")
    g.add_argument("--chat", action="store_true", help="render prompts with the checkpoint's own chat "
                   "template (tokenizer_config.json's chat_template; ChatML if it has none)")
    g.add_argument("--cost-table", default=None, help="simsd, spiffy: the cost table (tools/costs.py) that sizes "
                   "the copies a round verifies (default: the one next to the target's weights for this "
                   "device, if any; a model shape's: models/costs/<shape>/...; none: every copy verified)")
    g.add_argument("--stop-ids", default=None, help="comma-separated token ids that end decoding "
                   "(default: the checkpoint's eos_token_id list, generation_config.json's, and the "
                   "tokenizer's EOS)")
    return g


def rule_flags(ap):
    g = ap.add_argument_group("decoding rule (default: the threshold rule at %g)" % THRESHOLD)
    g.add_argument("--threshold", type=float, default=None,
                   help=f"the threshold rule (low_confidence_dynamic) at this confidence, in (0, 1] "
                        f"(default {THRESHOLD})")
    g.add_argument("--strategy", default=None, choices=STRATEGIES,
                   help="another of SDAR's strategies instead; low_confidence_static is one token a step")
    g.add_argument("--eb-threshold", type=float, default=EB_THRESHOLD,
                   help="entropy_bounded: bound on the summed entropy of a step's reveals")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens")
    g.add_argument("--top-p", type=float, default=None, help="nucleus sampling: the top-p mass")
    g.add_argument("--seed", type=int, default=0, help="for sampling (and random strategies)")
    return g


def simsd_flags(ap, variants=True):
    """SimSD's settings; variants: also --gamma, --verify and --accept (sample.py picks a
    variant by flags, bench.py by method name)."""
    g = ap.add_argument_group("SimSD (a drafter proposes, the target verifies)")
    if variants:
        g.add_argument("--gamma", type=int, default=None, help="max drafted tokens a round (default B x (1 + lookahead))")
        g.add_argument("--verify", dest="verifier", default=None, choices=VERIFIERS,
                       help="temporal = the paper's one-mask forward (2B queries); copies = the "
                            "drafter's states as exact block copies (default)")
        g.add_argument("--accept", dest="acceptance", default=None, choices=ACCEPTS,
                       help="paper = accept on agreement; gated = only where the target is sure; "
                            "lossless (default) = the target's own decoding, token for token")
    g.add_argument("--gate", type=float, default=None,
                   help=f"gated acceptance: the target confidence to accept at (default {GATE})")
    g.add_argument("--draft-steps", type=int, default=None,
                   help="drafter forwards a round, every decision on the device (default 3 at B = 4, else 1)")
    g.add_argument("--draft-threshold", type=float, default=None,
                   help=f"the drafter also drafts every position above this confidence (default {DRAFT_THRESHOLD})")
    g.add_argument("--draft-stop", type=float, default=None,
                   help=f"stop drafting when the drafter's best confidence falls below this (default {DRAFT_STOP})")
    if variants:
        g.add_argument("--reference", default=None, choices=REFERENCES,
                       help="where the drafted tokens come from: a drafter (default), the target's own "
                            "last forward (trajectory), or n-gram lookup in the prompt and the text so far "
                            "(lookup); the last two need no second model")
    g.add_argument("--lookup-n", type=int, default=None,
                   help=f"--reference lookup: the longest n-gram it matches (default {LOOKUP_N})")
    g.add_argument("--lookahead", type=int, default=None,
                   help=f"blocks past the current one the drafter may draft into, verified in the same "
                        f"target forward (default {LOOKAHEAD}; 0: within the block)")
    return g


def spiffy_flags(ap, graph=True):
    g = ap.add_argument_group("Spiffy (drafts from the target itself)")
    if graph:
        g.add_argument("--graph", default=None, help="draft graph JSON (default: next to the target)")
    g.add_argument("--draft-budget", type=int, default=None,
                   help=f"D*: draft-graph nodes verified a forward (default {DRAFT_BUDGET})")
    return g
