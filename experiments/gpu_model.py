"""The modelled GPU column (sol.GPU_MODEL) with and without what a forward count leaves out: the
same runs priced by forwards alone (weight reads or compute, the model before 2026-12-04), then
with each model's launch-bound floor and the host syncs the decoders make (counted by
decode.to_host). Counts are exact: the figures repeat run to run.

    python experiments/gpu_model.py 40        # held-out problems, B = 4 and 8, threshold rule
"""
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cli  # noqa: E402
from bench import runner  # noqa: E402
from measure.graphs import graphs_for  # noqa: E402
from training.tasks import calibration_prompts, load_tasks  # noqa: E402
from measure.sol import GPU_MODEL, modelled_gpu_cost  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", (4, 8))
tasks = load_tasks(None, n, tok, False, "arith")
graphs = graphs_for(cli.DEFAULT_TARGET, target, lambda: calibration_prompts(None, n, tok, False, []), [])
forwards_only = dict(GPU_MODEL, layer_s=0.0, sync_s=0.0)
print(f"{n} problems; target-forward equivalents per token, {GPU_MODEL['pair']}")
print(f"{'method':<26} {'B':>2} {'forwards only':>14} {'+ floors, syncs':>16} {'syncs/fwd':>10}")
for B in (4, 8):
    for method in ("threshold", "simsd-lossless+threshold", "spiffy+threshold"):
        run = runner(method, target, drafter, B, graphs)
        rows, rows_draft, tokens, syncs, nfe = Counter(), Counter(), 0, 0, 0
        for ids, _ in tasks:
            st = run(ids, 64)[1]
            rows.update(st["rows"]), rows_draft.update(st.get("rows_draft", {}))
            tokens, syncs, nfe = tokens + st["tokens"], syncs + st["syncs"], nfe + st["nfe"]
        old = modelled_gpu_cost(rows, rows_draft, tokens, gpu=forwards_only)
        new = modelled_gpu_cost(rows, rows_draft, tokens, syncs)
        print(f"{method:<26} {B:>2} {old:>14.3f} {new:>16.3f} {syncs / nfe:>10.2f}")
