"""--attention flex|sdpa through sample.py, bench.py and tools/harness.py: the kernel each value
runs, eager and compiled, its resolved value in the JSON, and both sides of a compiled-vs-eager
comparison on the same kernel. Two tests compile with inductor (plain decoding, B = 4, 8
tokens: tens of seconds each); bad values are tests/test_errors.py's and test_harness.py's."""
from contextlib import contextmanager

import pytest
import torch.nn.functional as F

import bench
import cli
import compiling
import fast
import model as model_module
import sample
from test_cli import last_json


@contextmanager
def kernels_counted(calls):
    """Inside, each eager call of flex_attention or SDPA from model.py appends its name to calls."""
    flex, sdpa = model_module.flex_attention, F.scaled_dot_product_attention
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_module, "flex_attention", lambda *a, **k: calls.append("flex") or flex(*a, **k))
        mp.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append("sdpa") or sdpa(*a, **k))
        yield


def test_the_default_is_flex_compiled_on_cuda_else_sdpa_and_a_given_value_wins():
    assert cli.attention(None, "cuda", "auto") == cli.attention(None, "cuda:0", "static") == "flex"
    assert cli.attention(None, "cuda", None) == cli.attention(None, "cpu", "auto") == "sdpa"
    assert cli.attention("sdpa", "cuda", "auto") == "sdpa" and cli.attention("flex", "cpu", None) == "flex"
    with pytest.raises(ValueError, match="^unknown --attention 'math'; choose from flex, sdpa$"):
        cli.attention("math", "cpu", None)


@pytest.mark.parametrize("given, runs", [(None, "sdpa"), ("flex", "flex"), ("sdpa", "sdpa")])
def test_sample_eager_runs_the_kernel_asked_for_and_says_which(given, runs, capsys):
    calls, argv = [], ["--spec", "simsd", "--max-new-tokens", "8", "--json"]
    with kernels_counted(calls):
        out, _ = sample.main(**sample.parse_args(argv + ["--attention", given] * bool(given)))
    rec = last_json(capsys.readouterr().out)
    assert rec["attention"] == runs and rec["token_ids"] == out
    assert set(calls) == {runs}


@pytest.mark.parametrize("attention", ["flex", "sdpa"])
def test_sample_compiled_is_checked_against_eager_on_the_same_kernel(attention, monkeypatch, capsys):
    """--compile: the warm-up's check decodes compiled, then eager (compiling.eager); the eager side
    runs the kernel asked for, and in fp32 a differing token would have been an error. The plumbing
    is what is tested here, so dynamo traces with aot_eager (a cold inductor build of flex took 126 s
    of the suite); tests/test_inductor.py holds each kernel's compiled decoding to eager's under
    inductor."""
    calls, eager = [], compiling.eager
    monkeypatch.setattr(fast, "compile_model", lambda m, how: fast.compile_dynamic(m, backend="aot_eager"))

    @contextmanager
    def eager_counted(*models):
        with eager(*models), kernels_counted(calls):
            yield
    monkeypatch.setattr(compiling, "eager", eager_counted)
    sample.main(**sample.parse_args(["--spec", "none", "--block-size", "4", "--max-new-tokens", "8",
                                     "--compile", "--attention", attention, "--json"]))
    assert last_json(capsys.readouterr().out)["attention"] == attention
    assert calls and set(calls) == {attention}


@pytest.mark.parametrize("given, runs", [(None, "sdpa"), ("flex", "flex")])
def test_bench_puts_the_attention_in_its_json_and_every_row(given, runs, monkeypatch, capsys):
    """--compile both (dynamo's eager backend, to be quick): the eager and the compiled rows
    attend alike, so "= eager" compares the compiler alone."""
    monkeypatch.setattr(fast, "compile_model", lambda m, how: fast.compile_dynamic(m, backend="eager"))
    status = bench.main(**bench.parse_args(["--prompts", "1", "--max-new-tokens", "8", "--methods",
                                            "threshold,simsd", "--compile", "both"]
                                           + ["--attention", given] * bool(given)))
    rec = last_json(capsys.readouterr().out)
    assert status == 0 and rec["attention"] == runs and len(rec["results"]) == 4
    assert [r["attention"] for r in rec["results"]] == [runs] * 4
    assert all(r["same_as_eager"] == 1 for r in rec["results"] if r["method"].endswith(" compiled"))


@pytest.mark.parametrize("given, runs", [("", "sdpa"), (",attention=flex", "flex"), (",attention=sdpa", "sdpa")])
def test_the_harness_takes_attention_among_its_model_args(given, runs, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval.api.registry import get_model
    from tools import harness  # noqa: F401  (registers sdar-spec)
    lm = get_model("sdar-spec").create_from_arg_string(f"device=cpu,spec=none{given}")
    assert lm.model.attn_impl == runs
    assert lm.complete("Question: 2 + 3 = ?\nAnswer:", dict(max_gen_toks=4), 0, lm.model, None) is not None
