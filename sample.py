"""Generate text with plain block-diffusion decoding, SimSD or Spiffy.

    python sample.py --spec simsd                       # embedded target + drafter, CPU
    python sample.py --spec spiffy --block-size 32 --threshold 0.9
    python sample.py --spec none --prompt "ROMEO:" --temperature 0.8 --seed 1
    python sample.py --spec simsd --target ~/SDAR-8B-Chat --drafter ~/SDAR-1.7B-Chat --chat \\
        --device cuda --dtype bfloat16 --prompt "What is 17 * 23?"

Text is printed block by block as it is committed, then a one-line summary; with --json the
last line is one JSON object (text, token_ids, nfe_target, nfe_draft, tokens_per_s, ...).
Flags, checkpoints, tokenizers and graphs are all checked before anything is printed: bad
input is one line `error: ...` on stderr and a non-zero exit status.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

import util
from decode import STRATEGIES, DecodeRule, check_prompt, generate
from model import Transformer
from speculate import ACCEPTS, DRAFT_STOP, DRAFT_THRESHOLD, VERIFIERS, check_settings, simsd_generate
from spiffy import graph_path, load_graph, spiffy_generate
from tokenizer import check_same_tokenizer, load_tokenizer

ROOT = Path(__file__).parent
DEFAULT_TARGET, DEFAULT_DRAFTER = ROOT / "models/target", ROOT / "models/drafter"
DEFAULT_PROMPT = ("Question: Max saves 4 dollars a week for 4 weeks and already had 2 dollars. "
                  "How much does Max have now?\nAnswer:")
SPECS = ("none", "simsd", "spiffy")
# --spec simsd decodes with the threshold rule unless told otherwise, and accepts losslessly:
# its output is the target's own threshold decoding, token for token. Measured on the embedded
# pair (README) this is the fastest variant that keeps the target's answers.
SIMSD_THRESHOLD = 0.9
SIMSD_DEFAULTS = dict(verifier="copies", acceptance="lossless", gamma=None, gate=0.9,
                      draft_threshold=DRAFT_THRESHOLD, draft_stop=DRAFT_STOP)  # simsd_generate's


def load(path, device="cpu", dtype=None, stop_ids=None):
    """A checkpoint directory -> (model, tokenizer). Decoding stops at every id the checkpoint
    lists (config.json's and generation_config.json's eos_token_id) and at the tokenizer's
    EOS, or at `stop_ids` when given (model.config.stop_ids)."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    model = Transformer.from_pretrained(path, device=device, dtype=dtype or torch.float32)
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


def compile_model(model, how="auto"):
    """--compile: "static" shapes (model.compile_decoding; CUDA graphs on CUDA), or one
    "dynamic"-shape graph (model.compile(dynamic=True)); "auto": static on CUDA, dynamic on
    the CPU (faster there: README, "Compiled decoding")."""
    how = "auto" if how is True else how
    if how not in COMPILE_MODES:
        raise ValueError(f"--compile {how!r}: choose from {', '.join(COMPILE_MODES)}")
    cuda = model.embed.weight.is_cuda
    if how == "static" or (how == "auto" and cuda):
        model.compile_decoding(**dict(mode="reduce-overhead") if cuda else {})
    else:
        model.compile(dynamic=True)


COMPILE_MODES = ("auto", "static", "dynamic")


def check_block_size(model, block_size, name):
    supported = model.config.block_sizes or (model.config.block_size,)
    if block_size not in supported:
        raise ValueError(f"{name} was trained for block size(s) {list(supported)}, not {block_size}")


def check_device(device):
    """A device this code runs on (cpu or cuda), and a GPU when one is asked for."""
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


def check_used(methods, chosen, owners, **given):
    """Refuse a flag given explicitly (not None) that none of `methods` reads; owners: flag ->
    the methods that read it; chosen: how the user picked the methods, for the message."""
    for name, value in given.items():
        if value is not None and not set(methods) & set(owners[name]):
            raise ValueError(f"--{name.replace('_', '-')} does nothing with {chosen} (it is for "
                             f"{', '.join(owners[name])})")


def check_args(spec, block_size, threshold, temperature, top_k, top_p, max_new_tokens, device,
               drafter, graph, draft_budget, eb_threshold, **simsd):
    """Every flag, before any file is read: the flags' own ranges, and no flag the method ignores."""
    if spec not in SPECS:
        raise ValueError(f"unknown --spec {spec!r}; choose from {', '.join(SPECS)}")
    util.check_positive(block_size=block_size, gamma=simsd["gamma"], top_k=top_k,
                        max_new_tokens=max_new_tokens, draft_budget=draft_budget)
    for name in ("threshold", "gate", "draft_threshold", "draft_stop"):
        x = threshold if name == "threshold" else simsd[name]
        if x is not None and not 0 < x <= 1:
            raise ValueError(f"--{name.replace('_', '-')} must be in (0, 1], got {x}")
    if not eb_threshold > 0:
        raise ValueError(f"--eb-threshold must be > 0, got {eb_threshold}")
    if not temperature >= 0:  # (NaN fails too)
        raise ValueError(f"--temperature must be >= 0, got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {top_p}")
    check_device(device)
    flags = dict(drafter=drafter, gamma=simsd["gamma"], verify=simsd["verifier"],  # simsd's
                 accept=simsd["acceptance"], gate=simsd["gate"], draft_threshold=simsd["draft_threshold"],
                 draft_stop=simsd["draft_stop"], graph=graph, draft_budget=draft_budget)
    check_used([spec], f"--spec {spec}", {k: ["spiffy" if k in ("graph", "draft_budget") else "simsd"]
                                          for k in flags}, **flags)
    if simsd["gate"] is not None and (simsd["acceptance"] or "gated") != "gated":
        raise ValueError(f"--gate does nothing with --accept {simsd['acceptance']} (it is for gated)")
    if spec == "simsd":
        check_settings(**{k: simsd[k] or default for k, default in SIMSD_DEFAULTS.items()},
                       rope_copy=True, order="tau")


def make_rule(model, block_size=None, threshold=None, temperature=0.0, top_k=None, top_p=None,
              steps=None, strategy=None, eb_threshold=0.35):
    """Plain decoding's rule: SDAR's static one token per step by default, the threshold rule
    (low_confidence_dynamic) when a threshold is given, or another of SDAR's strategies."""
    if threshold is not None and strategy not in (None, "low_confidence_dynamic"):
        raise ValueError(f"--threshold applies to the threshold rule, not --strategy {strategy}")
    strategy = strategy or ("low_confidence_dynamic" if threshold else "low_confidence_static")
    B = block_size or model.config.block_size
    return DecodeRule(model.config.mask_token_id, B, strategy=strategy, steps=steps,
                      threshold=0.9 if threshold is None else threshold, eb_threshold=eb_threshold,
                      temperature=temperature, top_k=top_k, top_p=top_p)


def main(spec="simsd", prompt=DEFAULT_PROMPT, target=DEFAULT_TARGET, drafter=None,
         block_size=None, gamma=None, threshold=None, temperature=0.0, top_k=None, top_p=None,
         max_new_tokens=64, seed=0, device="cpu", dtype=None, compile=False, chat=False,
         graph=None, draft_budget=None, as_json=False, verifier=None, acceptance=None, gate=None,
         draft_threshold=None, draft_stop=None, strategy=None, eb_threshold=0.35, stop_ids=None):
    """drafter, gamma, verifier, acceptance, gate, draft_threshold, draft_stop (simsd), graph,
    draft_budget (spiffy): None = the default, and an error when given to a method that does
    not use them."""
    simsd = dict(gamma=gamma, verifier=verifier, acceptance=acceptance, gate=gate,
                 draft_threshold=draft_threshold, draft_stop=draft_stop)
    check_args(spec, block_size, threshold, temperature, top_k, top_p, max_new_tokens, device,
               drafter, graph, draft_budget, eb_threshold, **simsd)
    dtype = getattr(torch, dtype) if dtype else None
    model, tok = load(target, device, dtype, stop_ids)
    if spec == "simsd" and threshold is None and strategy is None:
        threshold = SIMSD_THRESHOLD   # SimSD's default rule: see SIMSD_THRESHOLD
    rule = make_rule(model, block_size, threshold, temperature, top_k, top_p, None, strategy, eb_threshold)
    check_block_size(model, rule.block_size, "target")
    text = tok.apply_chat_template(prompt) if chat else prompt
    if chat and tok.chat_template is None:
        print(f"note: {target} has no chat_template; the prompt is in ChatML", file=sys.stderr)
    ids = tok.encode(text)
    check_prompt(ids, model.config, max_new_tokens, device)
    if spec == "simsd":
        draft_model, draft_tok = load(drafter or DEFAULT_DRAFTER, device, dtype)
        check_same_tokenizer(draft_tok, tok)
        check_block_size(draft_model, rule.block_size, "drafter")
        if (draft_model.config.vocab_size, draft_model.config.mask_token_id) != \
                (model.config.vocab_size, model.config.mask_token_id):
            raise ValueError("drafter and target differ in vocabulary size or mask token id")
    if spec == "spiffy":
        g = load_graph(graph or graph_path(target, rule), rule)
    if compile:
        compile_model(model, compile)
        if spec == "simsd":
            compile_model(draft_model, compile)
    shown = []

    def on_block(new):  # print as blocks are committed (decode the whole text: multi-byte pieces)
        before = tok.decode(shown)
        shown.extend(new)
        print(tok.decode(shown)[len(before):], end="", flush=True)

    gen = torch.Generator(device=device).manual_seed(seed)
    kw = dict(rule=rule, generator=gen, on_block=None if as_json else on_block)
    if not as_json:
        print(text, end="", flush=True)
    if spec == "none":
        out, stats = generate(model, ids, max_new_tokens, **kw)
    elif spec == "simsd":
        simsd = {k: v for k, v in simsd.items() if v is not None}
        out, stats = simsd_generate(model, draft_model, ids, max_new_tokens, **simsd, **kw)
    else:
        out, stats = spiffy_generate(model, ids, max_new_tokens, graph=g,
                                     draft_budget=draft_budget or 8, **kw)
    nfe_draft = stats.get("nfe_draft", 0)
    summary = (f"\n--- {stats['tokens']} tokens in {stats['seconds']:.2f} s "
               f"({stats['tokens'] / stats['seconds']:.1f} tok/s), target NFE {stats['nfe']} "
               f"({stats['tokens'] / stats['nfe']:.2f} tokens/forward), ended by "
               f"{'a stop id' if stats['stop'] == 'stop_id' else stats['stop']}")
    if spec == "simsd":
        summary += f", drafter NFE {nfe_draft}, mean accepted {stats['mean_accepted']:.2f}"
    if spec == "spiffy":
        summary += f", steps per forward {stats['steps_per_forward']}"
    print(summary)
    if as_json:
        rest = {k: v for k, v in stats.items() if k not in ("nfe", "nfe_draft")}
        print(json.dumps(dict(rest, text=tok.decode(out), token_ids=out, nfe_target=stats["nfe"],
                              nfe_draft=nfe_draft, tokens_per_s=stats["tokens"] / stats["seconds"])))
    return out, stats


def add_simsd_flags(ap):
    """The SimSD settings sample.py and bench.py share (None: simsd_generate's default)."""
    ap.add_argument("--gate", type=float, default=None,
                    help="simsd, gated acceptance: the target confidence to accept at (default 0.9)")
    ap.add_argument("--draft-threshold", type=float, default=None,
                    help=f"simsd: the drafter also drafts every position above this confidence "
                         f"(default {DRAFT_THRESHOLD})")
    ap.add_argument("--draft-stop", type=float, default=None,
                    help=f"simsd: stop drafting when the drafter's best confidence falls below this "
                         f"(default {DRAFT_STOP})")


def parse_args(argv=None):
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="simsd", choices=SPECS, help="decoding method (default simsd)")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--target", default=str(DEFAULT_TARGET), help="target checkpoint directory")
    ap.add_argument("--drafter", default=None, help=f"simsd: drafter checkpoint (default {DEFAULT_DRAFTER})")
    ap.add_argument("--block-size", type=int, default=None, help="default: the target's")
    ap.add_argument("--gamma", type=int, default=None, help="simsd: max drafted tokens a round (default B)")
    ap.add_argument("--verify", dest="verifier", default=None, choices=VERIFIERS,
                    help="simsd: temporal = the paper's one-mask forward (2B queries); copies = the "
                         "drafter's states as exact block copies (default)")
    ap.add_argument("--accept", dest="acceptance", default=None, choices=ACCEPTS,
                    help="simsd: paper = accept on agreement; gated = only where the target is sure; "
                         "lossless (default) = the target's own decoding, token for token")
    add_simsd_flags(ap)
    ap.add_argument("--threshold", type=float, default=None,
                    help="use the threshold rule (low_confidence_dynamic) with this confidence, in "
                         f"(0, 1]; simsd uses it at {SIMSD_THRESHOLD} unless --strategy is given")
    ap.add_argument("--strategy", default=None, choices=STRATEGIES,
                    help="SDAR's decoding strategy (default: low_confidence_static, or "
                         "low_confidence_dynamic with --threshold)")
    ap.add_argument("--eb-threshold", type=float, default=0.35,
                    help="entropy_bounded: bound on the summed entropy of a step's reveals")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--stop-ids", default=None, help="comma-separated token ids that end decoding "
                    "(default: the checkpoint's eos_token_id list, generation_config.json's, and "
                    "the tokenizer's EOS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--compile", nargs="?", const="auto", choices=COMPILE_MODES,
                    help="torch.compile the models: static shapes and CUDA graphs on CUDA, "
                         "dynamic shapes on the CPU (auto), or say which")
    ap.add_argument("--chat", action="store_true", help="render the prompt with the checkpoint's own "
                    "chat template (tokenizer_config.json's chat_template; ChatML if it has none)")
    ap.add_argument("--graph", default=None, help="spiffy: draft graph JSON (default: next to the target)")
    ap.add_argument("--draft-budget", type=int, default=None, help="spiffy: D*, nodes verified per forward (default 8)")
    ap.add_argument("--json", dest="as_json", action="store_true", help="last line: one JSON object")
    args = vars(ap.parse_args(argv))
    if args["stop_ids"] is not None:
        args["stop_ids"] = util.int_list(args["stop_ids"], "--stop-ids")
    return args


if __name__ == "__main__":
    util.run(lambda: main(**parse_args()))
