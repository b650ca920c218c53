"""An lm-evaluation-harness model, `sdar-spec`: lm-eval's generation tasks (gsm8k, ...) decoded
by this project's decoders (plain block-diffusion decoding, SimSD or Spiffy).

    pip install lm-eval
    python tools/harness.py --model sdar-spec --model_args spec=simsd,device=cpu --tasks gsm8k --limit 8
    python tools/harness.py --model sdar-spec --model_args target=~/SDAR-8B-Chat,drafter=~/SDAR-1.7B-Chat,\\
        spec=simsd,chat=True,device=cuda,dtype=bfloat16 --tasks gsm8k

`python tools/harness.py ARGS` is lm-eval's own command line (`lm_eval ARGS`, every flag) with this
model registered: lm-eval knows only the model classes imported before it runs, so a plain
`lm_eval --model sdar-spec` cannot find it. From Python: `import harness`, then
`lm_eval.simple_evaluate(model="sdar-spec", model_args=...)`.

model_args are sample.py's flags with underscores, checked as sample.py checks them: target,
drafter, spec, block_size, threshold, strategy, temperature, top_k, top_p, eb_threshold,
gamma, verify, accept, gate, draft_threshold, draft_stop, lookahead, graph, draft_budget, stop_ids
([2,5]), seed, device (over lm-eval's --device), dtype, compile, attention (flex or sdpa), chat (the whole prompt as one
user turn); max_new_tokens (256) for a request without max_gen_toks. A request's `until`
strings end decoding after the block they appear in, and cut its text before the first one;
its do_sample / temperature / top_k / top_p replace the model's (do_sample=False: greedy;
do_sample=True with no temperature above 0: 1.0, transformers' default). lm-eval's --batch_size N
decodes N requests together (serve/batch.py), request i from seed + i, each answer the one it
gets alone. Generation only: loglikelihood requests
(multiple-choice tasks, perplexity) and lm-eval's --apply_chat_template are refused.
"""
import dataclasses
import sys
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import cli  # noqa: E402
import sample  # noqa: E402
from loading import util  # noqa: E402
from serve.batch import decode_all as batch_decode  # noqa: E402

SMOKE = "--model sdar-spec --model_args spec=none,device=cpu --tasks arith --include_path {tasks} --limit 1"
SMOKE_OUTPUT = r"\|arith\s*\|.*\|exact_match\|"

NEEDS_LM_EVAL = "harness.py needs the lm-evaluation-harness: pip install lm-eval"
try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import simple_parse_args_string
except ImportError:
    if __name__ == "__main__":
        sys.exit(f"error: {NEEDS_LM_EVAL}")
    raise ImportError(NEEDS_LM_EVAL) from None

GENERATION_ONLY = ("sdar-spec is generation-only (generate_until tasks such as gsm8k): it scores no "
                   "loglikelihoods")
NO_CHAT_HISTORY = ("sdar-spec renders no chat history: instead of --apply_chat_template, give model_args "
                   "chat=True (the whole prompt as one user turn)")
SETTINGS = dict(  # model_arg -> (type, default); None as in sample.py: that method's default
    target=(Path, cli.DEFAULT_TARGET), drafter=(Path, None), spec=(str, "simsd"),
    block_size=(int, None), threshold=(float, None), strategy=(str, None), temperature=(float, 0.0),
    top_k=(int, None), top_p=(float, None), eb_threshold=(float, cli.EB_THRESHOLD), gamma=(int, None),
    verify=(str, None), accept=(str, None), gate=(float, None), draft_threshold=(float, None),
    draft_stop=(float, None), lookahead=(int, None), graph=(Path, None), draft_budget=(int, None),
    stop_ids=(tuple, None), reference=(str, None), lookup_n=(int, None),
    seed=(int, 0), device=(str, None), dtype=(str, None), compile=(str, None), attention=(str, None),
    chat=(bool, False),
    max_new_tokens=(int, 256))
GEN_KWARGS = dict(until=None, max_gen_toks=int, do_sample=bool, temperature=float, top_k=int, top_p=float)
KINDS = {int: "an integer", float: "a number", bool: "True or False", tuple: "integers like [2,5]"}


def convert(where, name, value, kind):
    """One setting as `kind`. lm-eval passes each as a string or already parsed ("4" -> 4,
    "True" -> True, "[2,5]" -> a list); anything else is a one-line ValueError."""
    text = str(value).strip()
    if value is None or text == "None":
        return None
    if kind is str:
        return text
    if kind is Path:
        return Path(text).expanduser()
    if kind is bool and text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        if kind is tuple:
            return util.int_list(text.strip("[]()").replace(" ", ""), name)
        if kind in (int, float) and not isinstance(value, bool):
            number = float(text)
            if kind is float or number.is_integer():
                return int(number) if kind is int else number
    except ValueError:
        pass
    raise ValueError(f"{where} {name}={value!r}: expected {KINDS[kind]}")


@register_model("sdar-spec")
class SDARSpec(LM):
    """lm-eval's generation requests, decoded batch_size at a time by the method `spec` chooses."""

    def __init__(self, batch_size=1, max_batch_size=None, **model_args):
        super().__init__()
        if not str(batch_size).isdigit() or int(batch_size) < 1 or max_batch_size is not None:
            raise ValueError(f"batch size {batch_size}: sdar-spec takes an integer >= 1 (not auto, "
                             "no max_batch_size)")
        self.batch_size = int(batch_size)
        unknown = sorted(set(model_args) - set(SETTINGS))
        if unknown:
            raise ValueError(f"unknown model_args {', '.join(unknown)}; choose from {', '.join(SETTINGS)}")
        if "spec" in model_args and model_args["spec"] is None:   # lm-eval reads spec=none as None
            model_args["spec"] = "none"
        if str(model_args.get("compile")).lower() in ("true", "false"):   # compile=True: "auto"
            model_args["compile"] = "auto" if str(model_args["compile"]).lower() == "true" else None
        a = {k: convert("model_args", k, model_args.get(k, default), kind)
             for k, (kind, default) in SETTINGS.items()}
        a["device"] = a["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
        for name, allowed in (("dtype", cli.DTYPES), ("compile", cli.COMPILE_MODES),
                              ("attention", cli.ATTENTIONS)):
            if a[name] not in (None, *allowed):
                raise ValueError(f"model_args {name}={a[name]!r}: choose from {', '.join(allowed)}")
        flags = dict(drafter=a["drafter"], gamma=a["gamma"], verifier=a["verify"], acceptance=a["accept"],
                     gate=a["gate"], draft_threshold=a["draft_threshold"], draft_stop=a["draft_stop"],
                     lookahead=a["lookahead"], draft_budget=a["draft_budget"], reference=a["reference"],
                     lookup_n=a["lookup_n"], **{k: a[k] for k in cli.RULE_FLAGS})
        cli.check_flags(a["spec"], a["device"], a["dtype"], a["block_size"], a["max_new_tokens"], a["graph"],
                        *cli.split_flags(flags))
        self._device, self.chat, self.seed = a["device"], a["chat"], a["seed"]
        self.max_new_tokens = a["max_new_tokens"]
        self.decoder, self.tok = sample.load(
            a["spec"], a["target"], device=a["device"], dtype=a["dtype"], stop_ids=a["stop_ids"],
            block_size=a["block_size"], graph=a["graph"], compile=a["compile"], attention=a["attention"],
            batch=self.batch_size, **flags)
        self.model, self.rule, self.models = self.decoder.target, self.decoder.rule, self.decoder.models
        if self.chat:   # a tokenizer with no chat format fails now, not at the first request
            self.tok.apply_chat_template("")
            if self.tok.chat_template is None:
                print(f"note: {a['target']} has no chat_template; the prompts are in ChatML",
                      file=sys.stderr)

    def generate_until(self, requests, disable_tqdm=False):
        """Every request, batch_size at a time (serve/batch.py), request i in lm-eval's order from
        seed + i: the same answers at every batch size. With a progress bar; each answer also
        goes to lm-eval's --use_cache database."""
        bar = tqdm(total=len(requests), desc="sdar-spec", disable=disable_tqdm)

        def one(i, request, t, d):
            text = self.complete(request.args[0], dict(request.args[1] or {}), i, t, d)
            bar.update()
            return text
        outputs, _ = batch_decode(one, requests, self.models, self.batch_size)
        bar.close()
        for request, text in zip(requests, outputs):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return outputs

    def complete(self, context, gen_kwargs, index, target, drafter):
        """One request's continuation, cut before its first `until` string, from seed + index, on
        the models `target`, `drafter` (serve.batch's stand-ins). Decoding stops at the end of the
        block where a string appears (checked on the text: a string may span tokens)."""
        unknown = sorted(set(gen_kwargs) - set(GEN_KWARGS))
        if unknown:
            raise ValueError(f"gen_kwargs {', '.join(unknown)}: not supported (only "
                             f"{', '.join(GEN_KWARGS)})")
        g = {k: convert("gen_kwargs", k, v, GEN_KWARGS[k]) for k, v in gen_kwargs.items() if k != "until"}
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else [u for u in until if u]
        t = 0.0 if g.get("do_sample") is False else g.get("temperature", self.rule.temperature)
        t = t or (1.0 if g.get("do_sample") else 0.0)   # sampling at temperature 0: transformers' 1.0
        rule = dataclasses.replace(self.rule, temperature=t, top_k=g.get("top_k", self.rule.top_k),
                                   top_p=g.get("top_p", self.rule.top_p))
        n = g.get("max_gen_toks", self.max_new_tokens)
        ids = self.tok.encode(self.tok.apply_chat_template(context) if self.chat else context)
        so_far = []

        def on_block(new):
            so_far.extend(new)
            return any(u in self.tok.decode(so_far) for u in until)

        gen = torch.Generator(device=self._device).manual_seed(self.seed + index)
        out, _ = self.decode(ids, n, rule, gen, on_block if until else None, (target, drafter))
        text = self.tok.decode(out)
        return text[:min((text.find(u) for u in until if u in text), default=len(text))]

    def decode(self, ids, n, rule, generator, on_block, models):
        """The decoder on one request, under the request's own rule (priced as the model_args' rule)."""
        return dataclasses.replace(self.decoder, rule=rule)(ids, n, generator, on_block, models=models)

    def loglikelihood(self, requests, disable_tqdm=False):
        raise NotImplementedError(GENERATION_ONLY)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError(GENERATION_ONLY)

    def apply_chat_template(self, chat_history, add_generation_prompt=True):
        raise NotImplementedError(NO_CHAT_HISTORY)

    @classmethod
    def create_from_arg_obj(cls, arg_dict, additional_config=None):
        """model_args win over lm-eval's own --device and --batch_size, which its command line
        always passes (device cuda:0 unless told otherwise; without a GPU that default is dropped)."""
        given = {k: v for k, v in (additional_config or {}).items() if v is not None}
        if str(given.get("device", "")).startswith("cuda") and not torch.cuda.is_available():
            given.pop("device")   # lm-eval's default cuda:0 on a machine without a GPU: the CPU,
            # as lm-eval's own models fall back (model_args device=cuda still fails)
        return cls(**{**given, **arg_dict})

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)


def main():
    """lm-eval's command line with sdar-spec registered; bad input, a generation-only refusal
    included, is one line."""
    from lm_eval.__main__ import cli_evaluate
    try:
        cli_evaluate()
    except NotImplementedError as e:
        if str(e) not in (GENERATION_ONLY, NO_CHAT_HISTORY):
            raise
        raise ValueError(str(e)) from None


if __name__ == "__main__":
    util.run(main)
