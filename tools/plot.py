"""The bench's figure: tokens per target forward against the block size, one line per method,
with one block a forward (B tokens) drawn in; tokens/s against the threshold rule beside it;
and the modelled GPU cost (target-forward equivalents per token, bench.py's GPU column) as
times cheaper than the threshold rule's. Reads the JSON of `bench.py --out`.

    python bench.py --block-size 4,8,32 --prompts 40 --repeats 3 --out docs/bench.json
    python tools/plot.py docs/bench.json docs/bench.png

matplotlib is needed for this picture only (pip install matplotlib).
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from loading import util  # noqa: E402

SMOKE = "{root}/docs/bench.json {tmp}/bench.png"
SMOKE_OUTPUT = r"wrote .*bench\.png"


def plot(bench_json, png):
    util.check_writable(png, "PNG")
    bench = util.read_json(bench_json)
    results = bench.get("results")
    if not isinstance(results, list) or not results:
        raise ValueError(f"{bench_json} holds no bench results (write one with bench.py --out)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("plot.py needs matplotlib (pip install matplotlib)") from None
    sizes = sorted({r["block_size"] for r in results})
    thr = {r["block_size"]: r for r in results if r["method"] == "threshold"}
    fig, (left, right, gpu) = plt.subplots(1, 3, figsize=(17, 4.2))
    left.plot(sizes, sizes, "k:", label="one block a forward (B tokens)")
    methods = list(dict.fromkeys(r["method"] for r in results))
    colours = {m: plt.cm.tab20(i % 20) for i, m in enumerate(dict.fromkeys(m.split("(")[0] for m in methods))}
    for method in methods:
        rows = sorted((r["block_size"], r) for r in results if r["method"] == method)
        bs, style = [b for b, _ in rows], dict(color=colours[method.split("(")[0]], label=method,
                                               ls="--" if "(" in method else "-", marker="o")
        left.plot(bs, [r["tokens_per_target_fwd"] for _, r in rows], **style)
        if thr:
            right.plot(bs, [r["tokens_per_s"] / thr[b]["tokens_per_s"] for b, r in rows], **style)
            if all("gpu_fwd_equiv_per_token" in r for _, r in rows):   # (older JSON: no GPU column)
                gpu.plot(bs, [thr[b]["gpu_fwd_equiv_per_token"] / r["gpu_fwd_equiv_per_token"] for b, r in rows],
                         **style)
    for ax, what in ((left, "tokens per target forward"), (right, "tokens/s, x the threshold rule"),
                     (gpu, "GPU cost (modelled): x cheaper than threshold")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("block size B"), ax.set_ylabel(what), ax.grid(alpha=0.3)
    left.set_yscale("log", base=2)
    right.axhline(1, color="k", lw=0.8), gpu.axhline(1, color="k", lw=0.8)
    gpu.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"bench.py on {bench.get('device')}, torch {bench.get('torch')}, {bench.get('prompts')} "
                 f"prompts, {bench.get('date')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_json", help="bench.py --out's JSON")
    ap.add_argument("png", help="the picture to write")
    a = ap.parse_args()
    util.run(lambda: plot(a.bench_json, a.png))
    print(f"wrote {a.png}", file=sys.stderr)
