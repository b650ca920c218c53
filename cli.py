"""What the command lines share (sample.py, bench.py, tools/harness.py, spiffy.py, measure/sol.py,
train.py): loading a checkpoint (and a drafter that fits it), the decoding rule, the prompts, and
the flags, grouped as --help shows them, each default defined once and each flag checked before
any file is read. Imports point down: this module imports the decoders, none of them imports it.
"""
import sys
from pathlib import Path

import torch

import compiling
from loading import checkpoint
from loading import util
import fast
import parallel
from decode import EB_THRESHOLD, STRATEGIES, DecodeRule, check_prompt
from decoder import SPECS
import variants
from speculate import DRAFT_STOP, DRAFT_THRESHOLD, LOOKAHEAD, Settings
from variants import ACCEPTS, GATE, LOOKUP_N, REFERENCES
from spiffy import DRAFT_BUDGET
from loading.tokenizer import check_same_tokenizer, load_tokenizer
from measure import pricing

ROOT = Path(__file__).parent
DEFAULT_TARGET, DEFAULT_DRAFTER = ROOT / "models/target", ROOT / "models/drafter"
# The one default decoding rule, for every method: the threshold rule (low_confidence_dynamic)
# at 0.9, the fastest plain rule measured here (README), so that `--spec none` and `--spec
# simsd` compare the same rule. `--strategy low_confidence_static` is SDAR's one token a step.
THRESHOLD = 0.9
COMPILE_MODES = (*fast.MODEL_COMPILES, "drafter")       # --compile: both models so, or the drafter alone
DTYPES = ("float32", "bfloat16", "float16")
ATTENTIONS = ("flex", "sdpa")   # --attention: FlexAttention (a BlockMask) or SDPA (a dense mask)


def load(path, device="cpu", dtype=None, stop_ids=None, split=None):
    """A checkpoint directory -> (model, tokenizer). Decoding stops at every id the checkpoint
    lists (config.json's and generation_config.json's eos_token_id) and at the tokenizer's
    EOS, or at `stop_ids` when given (model.config.stop_ids). dtype: a torch dtype or its name."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = checkpoint.from_pretrained(path, device=device, dtype=dtype or saved_dtype(path), split=split)
    c = model.config
    tok = load_tokenizer(path, mask_id=c.mask_token_id)
    if tok.vocab_size > c.vocab_size:
        raise ValueError(f"{path}: tokenizer has {tok.vocab_size} ids, the model only {c.vocab_size}")
    listed = [*(c.stop_ids or [c.eos_token_id]), *([tok.eos_id] if tok.eos_id is not None else [])]
    stops = tuple(dict.fromkeys(listed if stop_ids is None else check_stop_ids(stop_ids, tok, c.mask_token_id, path)))
    c.stop_ids = () if stops == (c.eos_token_id,) else stops    # (): eos_token_id alone
    return model, tok


def check_stop_ids(stop_ids, tok, mask_id, path):
    """--stop-ids: each a token id of the vocabulary but the mask token. -> stop_ids"""
    for i in stop_ids:
        if not 0 <= i < tok.vocab_size or i == mask_id:
            raise ValueError(f"--stop-ids: {i} is not a token id of {path}'s vocabulary "
                             f"(0..{tok.vocab_size - 1}, the mask token {mask_id} excepted)")
    return stop_ids


def load_target(path, device="cpu", dtype=None, stop_ids=None):
    """load(); under torchrun split over the ranks, refused on all if one fails (parallel.py)."""
    return parallel.agree(lambda: load(path, parallel.device(device), dtype, stop_ids, parallel.shard))


def saved_dtype(path):
    """--dtype's default: config.json's torch_dtype (transformers 5: dtype), else float32."""
    name = (hf := util.read_json(Path(path) / "config.json")).get("torch_dtype") or hf.get("dtype")
    return getattr(torch, name) if name in DTYPES else torch.float32


def attention(name, device, compile):
    """--attention for both models and both sides of every compiled-vs-eager comparison: as given,
    else flex compiled on CUDA (the only GPU run's, 2026-12-04), else SDPA (faster on a CPU)."""
    if name is not None and name not in ATTENTIONS:
        raise ValueError(f"unknown --attention {name!r}; choose from {', '.join(ATTENTIONS)}")
    return name or ("flex" if compile and torch.device(device).type == "cuda" else "sdpa")


def load_drafter(path, target, tok, block_sizes, device="cpu", dtype=None):
    """SimSD's drafter, checked against its target: the same tokenizer, vocabulary and mask token
    (here too, so that a bad drafter is refused where the method then runs the rule alone), and
    trained for every block size it will draft at."""
    drafter, draft_tok = load(path or DEFAULT_DRAFTER, device, dtype)
    check_same_tokenizer(draft_tok, tok)
    if (d := drafter.config).vocab_size != target.config.vocab_size or d.mask_token_id != target.config.mask_token_id:
        raise ValueError("drafter and target differ in vocabulary size or mask token id")
    for B in block_sizes:
        check_block_size(drafter, B, "drafter")
    return drafter


def simsd_drafter(target, drafter, reference, model, tok, block_size, device="cpu", dtype=None):
    """SimSD's drafter (None for a drafter-free --reference); models/drafter for models/target only."""
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
    tgt, tok = load_target(target, device, dtype, stop_ids)
    for B in block_sizes:
        check_block_size(tgt, B, "target")
    drf = None if drafter is None else load_drafter(drafter, tgt, tok, block_sizes, device, dtype)
    compiling.compile_models(tgt, drf, compile, attention)
    return tgt, tok, drf


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
    """A DecodeRule: the threshold rule when a threshold is given (split_flags' default), else SDAR's."""
    if threshold is not None and strategy not in (None, "low_confidence_dynamic"):
        raise ValueError(f"--threshold applies to the threshold rule, not --strategy {strategy}")
    strategy = strategy or ("low_confidence_dynamic" if threshold else "low_confidence_static")
    B = block_size or model.config.block_size
    return DecodeRule(model.config.mask_token_id, B, strategy=strategy, steps=steps,
                      threshold=THRESHOLD if threshold is None else threshold,
                      eb_threshold=eb_threshold, temperature=temperature, top_k=top_k, top_p=top_p)


def read_prompts(prompt, prompts_file, batch, default):
    """The prompts' texts: --prompt's (else `default`) or --prompts-file's, before any model loads."""
    util.check_positive(batch=batch)
    if prompt is not None and prompts_file is not None:
        raise ValueError("--prompt and --prompts-file: give one of them")
    if prompts_file is None:
        return [default if prompt is None else prompt]
    if not (texts := [r["question"] for _, r in util.read_prompts(prompts_file, "--prompts-file")]):
        raise ValueError(f"--prompts-file {prompts_file} holds no prompts")
    return texts


def encoded(tok, texts, chat, config, max_new_tokens, prompts_file):
    """-> (the texts, in the chat template with --chat, their ids), each checked before any decodes."""
    texts = [tok.apply_chat_template(t) if chat else t for t in texts]
    for k, one in enumerate(ids := [tok.encode(t) for t in texts]):
        try:
            check_prompt(one, config, max_new_tokens)
        except ValueError as e:
            raise ValueError(f"prompt {k} of {prompts_file}: {e}" if prompts_file else e) from None
    return texts, ids


# ---- checks: every flag before any file is read, in one line each

def warn(*lines):
    """Print each line given (None or "": none) on stderr: what a run should know, not stop for."""
    for line in filter(None, lines):
        print(line, file=sys.stderr)


def check_block_size(model, block_size, name):
    supported = model.config.block_sizes or (model.config.block_size,)
    if block_size not in supported:
        raise ValueError(f"{name} was trained for block size(s) {list(supported)}, not {block_size}")


def check_device(device, dtype=None):
    """A device this code runs on (cpu or cuda; check_gpu) and a --dtype it can run (check_dtype)."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown --device {device!r}; use cpu or cuda") from None
    if dev.type == "cuda":
        check_gpu(dev)
    elif dev.type != "cpu":
        raise ValueError(f"--device {device} is not supported; use cpu or cuda")
    check_dtype(device, dtype)


def check_gpu(dev):
    """--device cuda[:i]: that GPU is there, made the current one (flex attention's kernels run there)."""
    if not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but no GPU is available")
    if (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {dev}: there are only {torch.cuda.device_count()} GPU(s)")
    if dev.index is not None:
        torch.cuda.set_device(dev)


def check_dtype(device, dtype):
    """A --dtype the device can run (None: the checkpoint's own)."""
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown --dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if dtype == "bfloat16" and torch.device(device).type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--dtype bfloat16: {torch.cuda.get_device_name(device)} cannot run it; use float16")


def check_max_rows(rows, block_size):
    """--max-rows: at least one block (of --block-size, when given; else the decoders check it)."""
    if rows is not None and rows < (block_size or 1):
        raise ValueError(f"--max-rows {rows} is below one block ({block_size or 1} rows)")


def check_used(methods, chosen, owners, **given):
    """Refuse a flag given explicitly (not None) that none of `methods` reads; owners: flag ->
    the methods that read it; chosen: how the user picked the methods, for the message."""
    for name, value in given.items():
        if value is not None and not set(methods) & set(owners[name]):
            raise ValueError(f"--{name.replace('_', '-')} does nothing with {chosen} (it is for "
                             f"{', '.join(owners[name])})")


def check_unit(**values):   # confidences and probabilities: each None or in (0, 1]
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
RULE_FLAGS = dict(threshold=None, strategy=None, temperature=0.0, top_k=None, top_p=None, eb_threshold=EB_THRESHOLD)
METHOD_FLAGS = tuple(k for k in SIMSD_FLAGS + SPIFFY_FLAGS + SPEC_FLAGS if k != "graph")


def split_flags(flags):
    """sample.py's keyword flags -> (the rule's, RULE_FLAGS with their defaults; the method's,
    METHOD_FLAGS, None where not given); a name that is neither: an error."""
    if unknown := set(flags) - set(RULE_FLAGS) - set(METHOD_FLAGS):
        raise TypeError(f"unknown setting(s) {', '.join(sorted(unknown))}")
    rule = {k: flags.get(k, v) for k, v in RULE_FLAGS.items()}
    if rule["threshold"] is None and rule["strategy"] is None:   # the default rule
        rule["threshold"] = THRESHOLD
    return rule, {k: flags.get(k) for k in METHOD_FLAGS}


def check_flags(spec, device, dtype, block_size, max_new_tokens, graph, rule, method):
    """Every flag of sample.py's, before any file is read (rule, method: split_flags')."""
    if spec not in SPECS:
        raise ValueError(f"unknown --spec {spec!r}; choose from {', '.join(SPECS)}")
    util.check_positive(block_size=block_size, top_k=rule["top_k"], max_new_tokens=max_new_tokens)
    check_rule(rule["threshold"], rule["temperature"], rule["top_p"], rule["eb_threshold"])
    check_spec_flags(spec, block_size, graph=graph, **method)
    check_device(device, dtype)


def check_spec_flags(spec, block_size=None, **flags):
    """sample.py's and tools/harness.py's method flags: SIMSD_FLAGS for simsd, SPIFFY_FLAGS for
    spiffy (None: that method's default), each refused by the other methods."""
    owners = {k: ["simsd"] for k in SIMSD_FLAGS} | {k: ["spiffy"] for k in SPIFFY_FLAGS} | {
        k: ["simsd", "spiffy"] for k in SPEC_FLAGS}
    shown = {"verifier": "verify", "acceptance": "accept"}    # the flags' names on the command line
    check_used([spec], f"--spec {spec}", {shown.get(k, k): v for k, v in owners.items()},
               **{shown.get(k, k): v for k, v in flags.items()})
    if spec != "none":
        util.check_positive(gamma=flags["gamma"], draft_budget=flags["draft_budget"],
                            draft_steps=flags.get("draft_steps"))
        check_max_rows(flags.get("max_rows"), block_size)
    if spec == "simsd":
        check_simsd_flags(**flags)


def check_simsd_flags(verifier, acceptance, reference, lookup_n, gate, lookahead, **flags):
    """SimSD's settings (speculate.Settings.check), and its variant's where one is given (variants.check)."""
    check_unit(gate=gate, draft_threshold=flags["draft_threshold"], draft_stop=flags["draft_stop"])
    lookahead = (0 if verifier == "temporal" else LOOKAHEAD) if lookahead is None else lookahead
    Settings(verifier or "copies", lookahead, flags["gamma"], flags.get("draft_steps"), flags["draft_threshold"],
             flags["draft_stop"]).check()
    if (verifier, acceptance, reference, lookup_n, gate) != (None,) * 5:
        if gate is not None and acceptance != "gated":
            raise ValueError(f"--gate does nothing with --accept {acceptance or 'lossless'} (it is for gated)")
        variants.check(verifier == "temporal", acceptance or "lossless", reference or "drafter",
                       LOOKUP_N if lookup_n is None else lookup_n, gate)
        check_reference_flags(reference, lookup_n, **{k: flags.get(k) for k in (
            "drafter", "draft_threshold", "draft_stop", "gamma", "draft_steps")})


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
    add = g.add_argument
    add("--target", default=str(DEFAULT_TARGET), help="target checkpoint directory (HF layout)")
    add("--drafter", default=None, help="simsd: drafter checkpoint (default models/drafter)")
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    add("--dtype", default=None, choices=DTYPES, help="weights' dtype (default: config.json's torch_dtype, else fp32)")
    add("--max-rows", type=int, default=None, help="simsd, spiffy: the most query rows of a verification's copies "
        f"(default: on a GPU the largest compiled bucket, at most {pricing.GPU_ROWS}; on a CPU no cap)")
    add("--compile", nargs="?", const="auto", choices=COMPILE_MODES + ("both",) * both, help="torch.compile: static "
        "shapes and CUDA graphs on CUDA, dynamic shapes on the CPU (auto), or say which; drafter: the drafter alone"
        + both * "; both: every method a row eager and a row compiled, interleaved prompt by prompt")
    add("--attention", default=None, choices=ATTENTIONS, help="flex: FlexAttention; sdpa: a dense mask; the same "
        "eager and compiled (default: flex compiled on CUDA, else sdpa)")
    add("--chat", action="store_true", help="prompts in the checkpoint's chat template (ChatML if it has none)")
    add("--cost-table", default=None, help="simsd, spiffy: the cost table (tools/costs.py) that prices a round "
        "(default: the one next to the target's weights for this device, if any; none: every copy verified)")
    add("--stop-ids", default=None, help="comma-separated token ids that end decoding (default: the checkpoint's)")
    return g


def rule_flags(ap):
    g = ap.add_argument_group("decoding rule (default: the threshold rule at %g)" % THRESHOLD)
    add = g.add_argument
    add("--threshold", type=float, default=None, help=f"the threshold rule at this confidence (default {THRESHOLD})")
    add("--strategy", default=None, choices=STRATEGIES, help="another of SDAR's strategies; "
        "low_confidence_static: one token a step")
    add("--eb-threshold", type=float, default=EB_THRESHOLD, help="entropy_bounded: a step's summed entropy bound")
    add("--temperature", type=float, default=0.0, help="0 = greedy")
    add("--top-k", type=int, default=None, help="sample from the k most likely tokens")
    add("--top-p", type=float, default=None, help="nucleus sampling: the top-p mass")
    add("--seed", type=int, default=0, help="for sampling (and random strategies)")
    return g


def simsd_flags(ap, variants=True):
    """SimSD's settings; variants: --gamma, --verify, --accept, --reference too (bench: by name)."""
    g = ap.add_argument_group("SimSD (a drafter proposes, the target verifies)")
    add = g.add_argument
    if variants:
        add("--gamma", type=int, default=None, help="the most drafted tokens a round (default B x (1 + lookahead))")
        add("--verify", dest="verifier", default=None, choices=VERIFIERS, help="copies (default): the drafter's "
            "states as exact block copies; temporal: the paper's one-mask forward (2B queries)")
        add("--accept", dest="acceptance", default=None, choices=ACCEPTS, help="lossless (default): the target's "
            "own decoding; paper: on agreement; gated: only where the target is sure")
        add("--reference", default=None, choices=REFERENCES, help="the drafts' source: a drafter (default), the "
            "target's last forward (trajectory) or n-gram lookup in the text so far (lookup)")
    add("--gate", type=float, default=None, help=f"--accept gated: the target confidence it accepts at ({GATE})")
    add("--draft-steps", type=int, default=None, help="drafter forwards a round (default 3 at B = 4 and 8, else 2)")
    add("--draft-threshold", type=float, default=None, help=f"a drafter step also drafts every position above "
        f"this confidence ({DRAFT_THRESHOLD})")
    add("--draft-stop", type=float, default=None, help=f"stop drafting below this confidence ({DRAFT_STOP})")
    add("--lookup-n", type=int, default=None, help=f"--reference lookup: the n-gram it matches ({LOOKUP_N})")
    add("--lookahead", type=int, default=None, help=f"blocks past the open one a round drafts ({LOOKAHEAD})")
    return g


def spiffy_flags(ap, graph=True):
    g = ap.add_argument_group("Spiffy (drafts from the target itself)")
    if graph:
        g.add_argument("--graph", default=None, help="draft graph JSON (default: next to the target)")
    g.add_argument("--draft-budget", type=int, default=None, help=f"D*: draft-graph nodes a forward ({DRAFT_BUDGET})")
    return g


def parsed(ap, argv=None):
    """The flags of parser `ap` as main's keyword arguments (--stop-ids as a list of ints)."""
    args = vars(ap.parse_args(argv))
    if args.get("stop_ids") is not None:
        args["stop_ids"] = util.int_list(args["stop_ids"], "--stop-ids")
    return args
