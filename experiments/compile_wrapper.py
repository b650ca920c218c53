"""Inductor's C++ wrapper against its Python one, on a CPU (docs/history.md, "The compiled
forward's wrapper"): the same model compiled twice for dynamic shapes, once with
options={"cpp_wrapper": True} (what --compile does on a CPU), and eager, taken in turns
forward by forward (4 or 8 query rows after 120 cached, the logits of 1-4 of them read, as
decoding asks); the median of 200 forwards each. The wrapper is the Python code
inductor generates to call its kernels; in C++ it skips an interpreter per call. Tokens are
the same: the kernels are. It prints a line per model and query rows: ms a forward each way.

    python experiments/compile_wrapper.py            # the target, then the drafter
    TORCH_COMPILE_DISABLE=1 python experiments/compile_wrapper.py --forwards 2   # the flow
"""
import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import fast  # noqa: E402
from decode import Session  # noqa: E402
from loading import util  # noqa: E402

SMOKE = "--forwards 2"
SMOKE_OUTPUT = (r"drafter, 8 query rows: ms a forward, eager \d+\.\d+, compiled with the Python "
                r"wrapper \d+\.\d+, with the C\+\+ wrapper \d+\.\d+")


def session(model, cached=120):
    s = Session(model, 4, 512)
    s.prefill(torch.randint(10, 2000, (cached,)))
    return s


def forward(s, T, read):
    s.forward(torch.full((T,), 3), torch.arange(s.committed, s.committed + T), keep=4,
              rows=torch.arange(read))


def compiled_twice(m):
    """-> (m compiled with the Python wrapper, with the C++ one), every shape below warm."""
    python, cpp = copy.deepcopy(m), copy.deepcopy(m)
    fast.compile_dynamic(python)
    fast.compile_dynamic(cpp, options=dict(cpp_wrapper=True))
    for c in (python, cpp):
        for cached in (100, 120):
            for T in (4, 8):
                for read in (1, 2, 4):
                    forward(session(c, cached), T, read)
    return python, cpp


def medians(models, T, n):
    """ms a forward of T query rows, each model in turn, the median of n."""
    runs = {k: session(m) for k, m in models.items()}
    ms = {k: [] for k in runs}
    for i in range(n):
        for k, s in runs.items():
            t0 = time.perf_counter()
            forward(s, T, 1 + i % 4)
            ms[k].append(1e3 * (time.perf_counter() - t0))
    return {k: sorted(v)[len(v) // 2] for k, v in ms.items()}


def main(forwards=200):
    util.check_positive(forwards=forwards)
    torch.set_num_threads(2)
    target, _, drafter = cli.load_models(cli.DEFAULT_TARGET, "", [4], "cpu")
    with torch.no_grad():
        for name, m in (("target", target), ("drafter", drafter)):
            python, cpp = compiled_twice(m)
            for T in (4, 8):
                med = medians(dict(eager=m, python=python, cpp=cpp), T, forwards)
                print(f"{name}, {T} query rows: ms a forward, eager {med['eager']:.3f}, compiled "
                      f"with the Python wrapper {med['python']:.3f}, with the C++ wrapper "
                      f"{med['cpp']:.3f}: C++ x Python {med['python'] / med['cpp']:.2f} faster, "
                      f"x eager {med['eager'] / med['cpp']:.2f}", flush=True)


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--forwards", type=int, default=200, help="forwards timed a way (the median)")
    a = ap.parse_args()
    util.run(lambda: main(a.forwards))
