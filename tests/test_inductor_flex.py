"""Compiled decoding over FlexAttention under the real compiler writes eager's tokens: the flex
half of tests/test_inductor.py (its models, prompts and decoders), in a file of its own so that
the two halves, minutes of C++ compiling each, run on two workers side by side.

Run: python -m pytest tests/test_inductor_flex.py -q
"""
import pytest

from test_inductor import compiled_writes_eager_tokens, setting  # noqa: F401  (a fixture)


@pytest.mark.parametrize("shapes", ["dynamic", "static"])
def test_compiled_decoding_over_flex_writes_eager_tokens(setting, shapes):  # noqa: F811
    compiled_writes_eager_tokens(setting, "flex", shapes)
