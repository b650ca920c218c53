"""Generate text with plain block-diffusion decoding, SimSD or Spiffy.

    python sample.py --spec simsd                       # embedded target + drafter, CPU
    python sample.py --spec spiffy --block-size 32
    python sample.py --spec none --prompt "ROMEO:" --temperature 0.8 --seed 1
    python sample.py --spec none --strategy low_confidence_static      # one token a step
    python sample.py --spec simsd --prompts-file questions.jsonl --batch 8 --json   # many, together
    python sample.py --spec simsd --target ~/SDAR-8B-Chat --drafter ~/SDAR-1.7B-Chat --chat \\
        --device cuda --dtype bfloat16 --prompt "What is 17 * 23?"

Every method decodes with the same rule unless told otherwise: the threshold rule at 0.9
(cli.THRESHOLD); SimSD and Spiffy keep its output token for token, in fewer target forwards where
the cost tables say copies pay. Text is printed block by block, then a one-line summary (decoding
time apart from loading and warm-up; --compile's warm-up compiles every graph and checks the
tokens against eager); --json's last line is one JSON object. Bad input: one line `error: ...`,
exit status 1. The calls from here to SimSD's first verification: docs/design.md, section 7.
"""
import json
import time
import torch

import cli, fast
from decode import check_prompt, generate
from loading import util
from measure import costs, graphs, reach
from measure.counts import counting
from serve.batch import decode_all as batch_decode
from spiffy import spiffy_generate
from variants import simsd

DEFAULT_PROMPT = ("Question: Max saves 4 dollars a week for 4 weeks and already had 2 dollars. "
                  "How much does Max have now?\nAnswer:")
SPECS = ("none", "simsd", "spiffy")


def check_args(spec, device, block_size, max_new_tokens, threshold, temperature, top_k, top_p,
               eb_threshold, graph, flags, dtype=None):
    """Every flag, before any file is read (flags: cli.SIMSD_FLAGS and draft_budget)."""
    if spec not in SPECS:
        raise ValueError(f"unknown --spec {spec!r}; choose from {', '.join(SPECS)}")
    util.check_positive(block_size=block_size, top_k=top_k, max_new_tokens=max_new_tokens)
    cli.check_rule(threshold, temperature, top_p, eb_threshold)
    cli.check_spec_flags(spec, block_size, graph=graph, **flags)
    cli.check_device(device, dtype)


def prepare(spec, target, drafter, block_size, threshold, strategy, device, dtype, compile,
            stop_ids, graph, rule_kw, cost_table=None, verifier=None, reference=None, max_rows=None, attention="sdpa", acceptance=None, batch=1):
    """Load and check everything a run needs -> (model, tok, rule, run(ids, n, **kw), its copies'
    sizing in words, cli.warm_up's models, costs.stale's warning); kw: the decoder's own."""
    dtype = getattr(torch, dtype) if dtype else None
    model, tok = cli.load(target, device, dtype, stop_ids)
    rule = cli.make_rule(model, block_size, cli.default_threshold(threshold, strategy),
                         strategy=strategy, **rule_kw)
    cli.check_block_size(model, rule.block_size, "target")
    cost, cost_note = costs.cost_model(target, model, rule.block_size, cost_table, batch)
    rows = cli.max_rows(max_rows, device, compile, rule.block_size)
    method, temporal = reach.method_of(spec, reference, verifier), verifier == "temporal"
    scale, reach_note = reach.find(target, method, rule)   # the cut's reach (the temporal path cuts nothing)
    drf = cli.simsd_drafter(target, drafter, reference, model, tok, rule.block_size, device, dtype) if spec == "simsd" else None
    g = graphs.load_graph(graph or graphs.graph_path(target, rule), rule) if spec == "spiffy" else None   # checked, used or not
    alone = spec != "none" and (temporal or acceptance in (None, "lossless")) and cli.rule_alone(cost, target, method, rule, drf)
    if temporal:   # (the temporal path prices its drafting; it cuts no copies)
        cost_note = cost_note.replace("every copy verified", "every round drafts")
    cost_note = f"{'drafting priced' if temporal else 'copies sized'} by {cost_note}" + \
        (f"; at most {rows} rows a forward" if rows else "") + f"; {alone or reach_note}"
    # run(ids, n, **kw) decodes with `model` and `drf`, or the stand-ins serve.batch gives (t, d)
    if spec == "none" or alone:
        drf, run = None, lambda ids, n, t=model, d=None, rule=rule, generator=None, on_block=None, **_: generate(
            t, ids, n, rule, generator=generator, on_block=on_block)
    elif spec == "simsd":
        draft = cli.drafter_gate(cost, drf, target, rule, verifier, acceptance)   # where it pays
        run = lambda ids, n, t=model, d=drf, rule=rule, **kw: simsd(t, d, ids, n, **{**dict(
            rule=rule, reference=reference or "drafter", draft=draft, walk=fast.walk,
            cut=fast.cutter(cost, rows, rule.block_size, scale)), **kw})
    else:
        run = lambda ids, n, t=model, d=None, rule=rule, **kw: counting(spiffy_generate)(
            t, ids, n, rule, graph=g, walk=fast.walk, cut=fast.cutter(cost, rows, rule.block_size, scale), **kw)
    cli.compile_models(model, drf, compile, attention)
    plain, blocks = spec == "none", cli.verified_blocks(rule.block_size, rows)
    return model, tok, rule, run, None if plain else cost_note, dict(target=model, drafter=drf, max_blocks=2 if plain
        else 3 if temporal else blocks), None if plain or cost is None else cost.stale


def summary(spec, stats, rule, load_s, cost_note=None):
    s = (f"--- {stats['tokens']} tokens in {stats['seconds']:.2f} s "
         f"({stats['tokens'] / stats['seconds']:.1f} tok/s; loading and warm-up {load_s:.1f} s more), "
         f"{cli.describe(rule)}, target NFE {stats['nfe']} ({stats['tokens'] / stats['nfe']:.2f} "
         f"tokens/forward), ended by {'a stop id' if stats['stop'] == 'stop_id' else stats['stop']}")
    if spec == "simsd" and "reference" in stats:   # (not run as the rule alone)
        ref = f"drafter NFE {stats['nfe_draft']}" if stats["reference"] == "drafter" else f"{stats['reference']}"
        n = sum(stats["accept_hist"].values())     # rounds (those the gate let draft: below)
        mean = sum(k * v for k, v in stats["accept_hist"].items()) / max(n, 1)
        s += f", reference {ref}, mean accepted {mean:.2f}, {n - stats['round_ends'].get('nothing drafted', 0)} of {n} rounds drafted"
    s += f", steps per forward {stats['steps_per_forward']}" if spec == "spiffy" and "steps_per_forward" in stats else ""
    return s + (f", {cost_note}" if cost_note else "")


def main(spec="simsd", prompt=None, target=cli.DEFAULT_TARGET, prompts_file=None, batch=1,
         block_size=None, threshold=None, strategy=None, max_new_tokens=64, seed=0, device="cpu",
         dtype=None, compile=False, attention=None, chat=False, as_json=False, stop_ids=None, graph=None,
         temperature=0.0, top_k=None, top_p=None, eb_threshold=cli.EB_THRESHOLD, **method):
    """method: SimSD's cli.SIMSD_FLAGS, Spiffy's cli.SPIFFY_FLAGS but graph, and cli.SPEC_FLAGS
    (None = the default; an error when given to a method that does not use them)."""
    flags = {k: method.pop(k, None) for k in cli.SIMSD_FLAGS + cli.SPIFFY_FLAGS + cli.SPEC_FLAGS if k != "graph"}
    if method:
        raise TypeError(f"unknown setting(s) {', '.join(method)}")
    check_args(spec, device, block_size, max_new_tokens, threshold, temperature, top_k, top_p,
               eb_threshold, graph, flags, dtype)
    texts, t0 = read_prompts(prompt, prompts_file, batch), time.perf_counter()
    model, tok, rule, run, cost_note, warm, stale = prepare(
        spec, target, flags.pop("drafter"), block_size, threshold, strategy, device, dtype, compile,
        stop_ids, graph, dict(temperature=temperature, top_k=top_k, top_p=top_p, eb_threshold=eb_threshold),
        flags.pop("cost_table"), flags["verifier"], flags["reference"], flags.pop("max_rows"), cli.attention(attention, device, compile), flags["acceptance"], batch)
    texts, prompts = encoded(tok, texts, chat, model.config, max_new_tokens, prompts_file)
    cli.warn(chat and tok.chat_template is None and f"note: {target} has no chat_template; the prompt is in ChatML", stale)
    kw = {k: v for k, v in flags.items() if v is not None}
    if prompts_file is not None:
        return many(run, prompts, tok, (warm["target"], warm["drafter"]), batch, seed,
                    max_new_tokens, compile, as_json, t0, kw)
    text, ids = texts[0], prompts[0]
    seeded = lambda: torch.Generator(device=device).manual_seed(seed)   # noqa: E731
    decode = lambda n: run(ids, n, generator=seeded(), **kw)[0]          # noqa: E731
    if compile:   # every graph built, and the tokens checked against eager's, before the timing
        cli.warm_up([lambda _, n: decode(n)], [ids], max_new_tokens, rule.block_size, **warm)
        cli.check_compiled(lambda: decode(max_new_tokens), warm["target"], warm["drafter"])
    else:         # one block: the first forwards' one-off costs
        decode(min(rule.block_size, max_new_tokens))
    load_s, shown = time.perf_counter() - t0, []

    def on_block(new):  # print as blocks are committed (decode the whole text: multi-byte pieces)
        before = tok.decode(shown)
        shown.extend(new)
        print(tok.decode(shown)[len(before):], end="", flush=True)

    print("" if as_json else text, end="", flush=True)
    out, stats = run(ids, max_new_tokens, generator=seeded(),
                     on_block=None if as_json else on_block, **kw)
    print("\n" + summary(spec, stats, rule, load_s, cost_note))
    if as_json:
        rest = {k: v for k, v in stats.items() if k not in ("nfe", "nfe_draft")}
        print(json.dumps(dict(rest, attention=model.attn_impl, text=tok.decode(out), token_ids=out, nfe_target=stats["nfe"],
                              nfe_draft=stats.get("nfe_draft", 0), load_s=load_s, rule=cli.describe(rule), cost_model=cost_note,
                              tokens_per_s=stats["tokens"] / stats["seconds"])))
    return out, stats


def read_prompts(prompt, prompts_file, batch):
    """The prompts' texts: --prompt's (default DEFAULT_PROMPT), or each line's "question" in
    --prompts-file, checked with --batch before any model is loaded."""
    util.check_positive(batch=batch)
    if prompt is not None and prompts_file is not None:
        raise ValueError("--prompt and --prompts-file: give one of them")
    if prompts_file is None:
        return [DEFAULT_PROMPT if prompt is None else prompt]
    texts = [r["question"] for _, r in util.read_prompts(prompts_file, "--prompts-file")]
    if not texts:
        raise ValueError(f"--prompts-file {prompts_file} holds no prompts")
    return texts


def encoded(tok, texts, chat, config, max_new_tokens, prompts_file):
    """-> (the texts, in the chat template with --chat, their ids), each prompt checked before
    any is decoded (a prompt too long for the context: an error naming it)."""
    texts = [tok.apply_chat_template(t) if chat else t for t in texts]
    for k, one in enumerate(ids := [tok.encode(t) for t in texts]):
        try:
            check_prompt(one, config, max_new_tokens)
        except ValueError as e:
            raise ValueError(f"prompt {k} of {prompts_file}: {e}" if prompts_file else e) from None
    return texts, ids


def many(run, prompts, tok, models, batch, seed, max_new_tokens, compile, as_json, t0, kw):
    """--prompts-file: every prompt decoded `batch` at a time (serve/batch.py), prompt i as
    `--prompt <it> --seed <seed + i>` alone decodes it; printed in the file's order, then a
    summary of them all (with --json, a JSON object a prompt, then the summary's)."""
    device = models[0].embed.weight.device

    def decode(n, prompts=prompts, progress=False):
        return batch_decode(lambda i, ids, t, d: run(ids, n, t, d, generator=torch.Generator(
            device=device).manual_seed(seed + i), **kw), prompts, models, batch, progress)
    if compile:   # batched compiled == batched eager on the first `batch` prompts, then timing
        cli.check_compiled(lambda: [x for out, _ in decode(max_new_tokens, prompts[:batch])[0] for x in out], *models)
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
                    help="none = plain decoding, simsd = a drafter's drafts, spiffy = the target's own "
                         "(default simsd)")
    ap.add_argument("--prompt", default=None, help="the text to continue (default: a held-out word problem)")
    ap.add_argument("--prompts-file", default=None, help="JSONL, a \"question\" a line: decode them all, "
                    "--batch at a time, each as it decodes alone with --seed + its line's index")
    ap.add_argument("--batch", type=int, default=1, help="--prompts-file: prompts decoded together (default 1)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="the most tokens to add")
    ap.add_argument("--block-size", type=int, default=None, help="B (default: the target's)")
    for flags in (cli.model_flags, cli.rule_flags, cli.simsd_flags, cli.spiffy_flags):
        flags(ap)
    ap.add_argument_group("output").add_argument("--json", dest="as_json", action="store_true", help="last line: one JSON object")
    args = vars(ap.parse_args(argv))
    if args["stop_ids"] is not None:
        args["stop_ids"] = util.int_list(args["stop_ids"], "--stop-ids")
    return args


if __name__ == "__main__":
    util.run(lambda: main(**parse_args()))
