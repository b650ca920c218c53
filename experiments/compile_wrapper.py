"""Inductor's C++ wrapper against its Python one, on a CPU (docs/results.md, "The compiled
forward's wrapper"): the same model compiled twice for dynamic shapes, once with
options={"cpp_wrapper": True} (what --compile does on a CPU), and eager, taken in turns
forward by forward (4 or 8 query rows after 120 cached, the logits of 1-4 of them read, as
decoding asks); the median of 200 forwards each. The wrapper is the Python code
inductor generates to call its kernels; in C++ it skips an interpreter per call. Tokens are
the same: the kernels are.

    python experiments/compile_wrapper.py            # the target, then the drafter
"""
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import fast  # noqa: E402
from decode import Session  # noqa: E402

torch.set_num_threads(2)
target, _, drafter = cli.load_models(cli.DEFAULT_TARGET, "", [4], "cpu")


def session(model, cached=120):
    s = Session(model, 4, 512)
    s.prefill(torch.randint(10, 2000, (cached,)))
    return s


def forward(s, T, read):
    s.forward(torch.full((T,), 3), torch.arange(s.committed, s.committed + T), keep=4, rows=torch.arange(read))


with torch.no_grad():
    for name, m in (("target", target), ("drafter", drafter)):
        python, cpp = copy.deepcopy(m), copy.deepcopy(m)
        fast.compile_dynamic(python)
        fast.compile_dynamic(cpp, options=dict(cpp_wrapper=True))
        for c in (python, cpp):                       # warm-up: every shape below compiled
            for cached in (100, 120):
                for T in (4, 8):
                    for read in (1, 2, 4):
                        forward(session(c, cached), T, read)
        for T in (4, 8):
            runs = dict(eager=session(m), python=session(python), cpp=session(cpp))
            ms = {k: [] for k in runs}
            for i in range(200):
                for k, s in runs.items():
                    t0 = time.perf_counter()
                    forward(s, T, 1 + i % 4)
                    ms[k].append(1e3 * (time.perf_counter() - t0))
            med = {k: sorted(v)[len(v) // 2] for k, v in ms.items()}
            print(f"{name}, {T} query rows: ms a forward, eager {med['eager']:.3f}, compiled with "
                  f"the Python wrapper {med['python']:.3f}, with the C++ wrapper {med['cpp']:.3f}: "
                  f"C++ x Python {med['python'] / med['cpp']:.2f} faster, "
                  f"x eager {med['eager'] / med['cpp']:.2f}")
