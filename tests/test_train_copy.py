"""Stage two's copy weighting (train.py --copy-weight): which answer tokens `objective.copied`
marks, the weights `Batches` gives them, and that `bd3lm_loss` with equal weights is the plain
loss."""
import numpy as np
import torch

from training import objective
from conftest import make_model

EOS, ANSWER = 0, 3               # token ids: the end of a document, "Answer:"
ENTITIES = [5, 6, 7, 8]          # the people and things; 9 and 10 are other words
DOCS = [([5, 7, 9, ANSWER], [5, 8, 7, 9, 6]),   # (question through "Answer:", answer)
        ([5, 7, 10], None),                     # text: no question
        ([6, 10, ANSWER], [5, 6, 10])]
# per answer token: one of ENTITIES and named in its own document's question
COPIED = [[True, False, True, False, False],    # 8 is not in the question, 9 is not an entity,
          None,                                 # 6 is in another document's question only
          [False, True, False]]                 # 5 is in the first document's question only


def corpus():
    """-> (tokens, question marks, expected copied) of DOCS, each document followed by EOS."""
    data, prompt, expected = [], [], []
    for (question, answer), copied in zip(DOCS, COPIED):
        body = question + (answer or [])
        data += body + [EOS]
        prompt += [answer is not None] * len(question) + [False] * (len(answer or []) + 1)
        expected += [False] * len(question) + (copied or []) + [False]
    return np.array(data, np.uint16), np.array(prompt), np.array(expected)


def test_copied_marks_the_answer_entities_named_in_the_same_question():
    data, prompt, expected = corpus()
    padded, marked = objective.mark_prompts(data, [ANSWER], EOS)
    assert (padded == data).all() and (marked == prompt).all()
    assert objective.copied(data, prompt, EOS, ENTITIES).tolist() == expected.tolist()
    assert not objective.copied(data, prompt, EOS, []).any()
    assert objective.copied(data, prompt, EOS, [7]).tolist() == (expected & (data == 7)).tolist()


def test_batches_weigh_the_copies_by_copy_weight(tmp_path):
    data, _, expected = corpus()
    data.tofile(tmp_path / "train.bin")
    batches = objective.Batches(tmp_path / "train.bin", 8, 0, answer_ids=[ANSWER], eos_id=EOS,
                                copy_ids=ENTITIES, copy_weight=4.0)
    assert batches.weight.tolist() == np.where(expected, 4.0, 1.0).tolist()
    x, prompt, weight = batches(3)
    assert x.shape == prompt.shape == weight.shape == (3, 8) and weight.dtype == torch.float32


@torch.no_grad()
def test_bd3lm_loss_with_equal_weights_is_the_unweighted_loss():
    model = make_model()
    x0 = torch.randint(4, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    loss = lambda **kw: objective.bd3lm_loss(model, x0, 4, torch.Generator().manual_seed(1), **kw)
    plain = loss()
    torch.testing.assert_close(loss(weight=torch.ones(2, 32)), plain)
    torch.testing.assert_close(loss(weight=torch.full((2, 32), 3.0)), plain)
    keep = x0 % 2 == 0                                       # with positions kept clean, too
    torch.testing.assert_close(loss(keep=keep, weight=torch.ones(2, 32)), loss(keep=keep))
    heavier = torch.where(x0 % 3 == 0, 5.0, 1.0)             # and unequal weights differ
    assert not torch.isclose(loss(weight=heavier), plain)
