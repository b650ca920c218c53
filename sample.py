"""Generate text with plain block-diffusion decoding, SimSD or Spiffy.

    python sample.py --spec simsd                       # embedded target + drafter, CPU
    python sample.py --spec spiffy --block-size 32 --cost-table none   # every copy verified
    python sample.py --spec none --prompt "ROMEO:" --temperature 0.8 --seed 1
    python sample.py --spec simsd --prompts-file questions.jsonl --batch 8 --json   # many, together
    python sample.py --spec simsd --target ~/SDAR-8B-Chat --drafter ~/SDAR-1.7B-Chat --chat --device cuda

Parse, load, build the decoder (decoder.py), decode, print. Every method decodes with the threshold
rule at 0.9 unless told otherwise; SimSD and Spiffy keep its output token for token, in fewer target
forwards where the tables say copies pay (else the rule alone). Text is printed block by block, then a
summary line (--json: a JSON object). Bad input: one line `error: ...`, exit status 1. Section 7 of
docs/design.md follows SimSD from here to its first verification.
"""
import json
import time

import torch

import cli
from compiling import check_compiled, compile_models, warm_up
from decoder import SPECS, build
from loading import util
import parallel
from serve.batch import decode_all

DEFAULT_PROMPT = ("Question: Max saves 4 dollars a week for 4 weeks and already had 2 dollars. "
                  "How much does Max have now?\nAnswer:")


def main(spec="simsd", prompt=None, target=cli.DEFAULT_TARGET, prompts_file=None, batch=1, block_size=None,
         max_new_tokens=64, seed=0, device="cpu", dtype=None, compile=False, attention=None, chat=False,
         as_json=False, stop_ids=None, graph=None, **flags):
    """flags: the rule's (cli.RULE_FLAGS) and the method's (cli.METHOD_FLAGS; None: the default;
    an error when given to a method that does not use them), as the command line names them."""
    cli.check_flags(spec, device, dtype, block_size, max_new_tokens, graph, *cli.split_flags(flags))
    texts, t0 = cli.read_prompts(prompt, prompts_file, batch, DEFAULT_PROMPT), time.perf_counter()
    dec, tok = load(spec, target, device=device, dtype=dtype, stop_ids=stop_ids, block_size=block_size, graph=graph,
                    compile=compile, attention=attention, batch=batch, **flags)
    texts, prompts = cli.encoded(tok, texts, chat, dec.target.config, max_new_tokens, prompts_file)
    cli.warn(chat and tok.chat_template is None and f"note: {target} has no chat_template; the prompt is in ChatML",
             dec.pricing and dec.pricing.stale)
    if prompts_file is not None:
        return many(dec, prompts, tok, batch, seed, max_new_tokens, compile, as_json, t0)
    seeded = lambda: torch.Generator(device=device).manual_seed(seed)   # noqa: E731
    decode = lambda n: dec(prompts[0], n, seeded())[0]                  # noqa: E731
    if compile:   # every graph built, and the tokens checked against eager's, before the timing
        warm_up([lambda _, n: decode(n)], prompts, max_new_tokens, dec.rule.block_size, *dec.models, dec.max_blocks)
        check_compiled(lambda: decode(max_new_tokens), *dec.models)
    else:         # one block: the first forwards' one-off costs
        decode(min(dec.rule.block_size, max_new_tokens))
    load_s, shown = time.perf_counter() - t0, []

    def on_block(new):  # print as blocks are committed (decode the whole text: multi-byte pieces)
        before = tok.decode(shown)
        shown.extend(new)
        print(tok.decode(shown)[len(before):], end="", flush=True)

    print("" if as_json else texts[0], end="", flush=True)
    out, stats = dec(prompts[0], max_new_tokens, seeded(), None if as_json else on_block)
    print("\n" + summary(dec, stats, load_s))
    if as_json:
        print(json.dumps(record(dec, tok, out, stats, load_s)))
    return out, stats


def record(dec, tok, out, stats, load_s):
    """--json's object: the text, its ids, the counts and how they were decoded."""
    rest = {k: v for k, v in stats.items() if k not in ("nfe", "nfe_draft")} | parallel.describe(dec.target)
    return dict(rest, text=tok.decode(out), token_ids=out, nfe_target=stats["nfe"], nfe_draft=stats.get("nfe_draft", 0),
                load_s=load_s, tokens_per_s=stats["tokens"] / stats["seconds"], attention=dec.target.attn_impl,
                rule=cli.describe(dec.rule), cost_model=dec.pricing and dec.pricing.note)


def load(spec="simsd", target=cli.DEFAULT_TARGET, *, device="cpu", dtype=None, stop_ids=None, block_size=None,
         graph=None, compile=None, attention=None, batch=1, **flags):
    """Load the checkpoints, build the decoder main's flags ask for (priced in a batch of `batch`)."""
    rule_flags, flags = cli.split_flags(flags)
    model, tok = cli.load_target(target, device, dtype, stop_ids)
    rule = cli.make_rule(model, block_size, **rule_flags)
    cli.check_block_size(model, rule.block_size, "target")
    drafter_dir, cost_table, max_rows = flags.pop("drafter"), flags.pop("cost_table"), flags.pop("max_rows")
    drafter = cli.simsd_drafter(target, drafter_dir, flags["reference"], model, tok, rule.block_size, device,
                                dtype) if spec == "simsd" else None
    dec = build(spec, target, model, rule, drafter, settings=flags, graph=graph, table=cost_table,
                max_rows=max_rows, device=device, compile=compile, batch=batch)
    compile_models(*dec.models, compile, cli.attention(attention, device, compile))
    return dec, tok


def summary(dec, stats, load_s):
    """The one-line summary: tokens, time, rule, target forwards; a speculative method's own."""
    s = (f"--- {stats['tokens']} tokens in {stats['seconds']:.2f} s "
         f"({stats['tokens'] / stats['seconds']:.1f} tok/s; loading and warm-up {load_s:.1f} s more), "
         f"{cli.describe(dec.rule)}, target NFE {stats['nfe']} ({stats['tokens'] / stats['nfe']:.2f} "
         f"tokens/forward), ended by {'a stop id' if stats['stop'] == 'stop_id' else stats['stop']}")
    return s if dec.pricing is None else s + speculated(dec, stats) + f", {dec.pricing.note}"


def speculated(dec, stats):
    """The summary's part for SimSD (its drafter, its rounds) or Spiffy (steps a forward)."""
    if dec.rule_only:
        return ""
    if dec.method == "spiffy":
        return f", steps per forward {stats['steps_per_forward']}"
    ref = f"drafter NFE {stats['nfe_draft']}" if stats["reference"] == "drafter" else stats["reference"]
    n = sum(stats["accept_hist"].values())     # rounds (those the gate let draft: below)
    mean = sum(k * v for k, v in stats["accept_hist"].items()) / max(n, 1)
    return f", reference {ref}, mean accepted {mean:.2f}, " + \
        f"{n - stats['round_ends'].get('nothing drafted', 0)} of {n} rounds drafted"


def many(dec, prompts, tok, batch, seed, max_new_tokens, compile, as_json, t0):
    """--prompts-file: every prompt decoded `batch` at a time (serve/batch.py), prompt i as
    `--prompt <it> --seed <seed + i>` alone decodes it (priced at the batch's share: README);
    printed in the file's order, then a summary of them all (with --json, a JSON object a
    prompt, then the summary's)."""
    device = dec.target.embed.weight.device

    def decode(n, prompts=prompts, progress=False):
        return decode_all(lambda i, ids, t, d: dec(ids, n, torch.Generator(device=device).manual_seed(seed + i),
                                                   models=(t, d)), prompts, dec.models, batch, progress)
    if compile:   # batched compiled == batched eager on the first `batch` prompts, then timing
        check_compiled(lambda: [x for out, _ in decode(max_new_tokens, prompts[:batch])[0] for x in out], *dec.models)
    else:
        decode(4, prompts[:batch])
    load_s, t1 = time.perf_counter() - t0, time.perf_counter()
    results, pools = decode(max_new_tokens, progress=True)   # (a bar on stderr where it is a terminal)
    seconds, tokens = time.perf_counter() - t1, sum(len(out) for out, _ in results)
    for i, (out, st) in enumerate(results):
        counts = dict(tokens=st["tokens"], stop=st["stop"], nfe_target=st["nfe"], nfe_draft=st.get("nfe_draft", 0))
        print(json.dumps(dict(prompt=i, text=tok.decode(out), token_ids=out, **counts)) if as_json else
              f"=== prompt {i}: {tok.decode(prompts[i])}{tok.decode(out)}\n--- {counts}")
    fwd, rows = pools[0].forwards, sum(T * n for T, n in pools[0].query_rows.items())
    total = dict(prompts=len(prompts), batch=batch, tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds,
                 target_forwards=fwd, target_rows_per_forward=rows / fwd, load_s=load_s,
                 drafter_forwards=pools[1].forwards if pools[1] else 0, buckets=dict(pools[0].buckets))
    print(json.dumps(total) if as_json else f"--- {len(prompts)} prompts, {tokens} tokens in {seconds:.2f} s "
          f"({tokens / seconds:.1f} tok/s in all; loading and warm-up {load_s:.1f} s more), batch {batch}: {fwd} "
          f"target forwards ({tokens / fwd:.2f} tokens, {rows / fwd:.1f} query rows a forward)")
    return results, total


def parse_args(argv=None):
    ap = util.ArgumentParser(description=__doc__, formatter_class=util.argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="simsd", choices=SPECS,
                    help="none = plain decoding, simsd = a drafter's drafts, spiffy = the target's own (default simsd)")
    ap.add_argument("--prompt", default=None, help="the text to continue (default: a held-out word problem)")
    ap.add_argument("--prompts-file", default=None, help="JSONL, a \"question\" a line: all, --batch at a time")
    ap.add_argument("--batch", type=int, default=1, help="prompts decoded together, each priced so (default 1)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="the most tokens to add")
    ap.add_argument("--block-size", type=int, default=None, help="B (default: the target's)")
    for flags in (cli.model_flags, cli.rule_flags, cli.simsd_flags, cli.spiffy_flags):
        flags(ap)
    ap.add_argument_group("output").add_argument("--json", dest="as_json", action="store_true", help="last line: JSON")
    return cli.parsed(ap, argv)


if __name__ == "__main__":
    parallel.run(lambda: main(**parse_args()))
