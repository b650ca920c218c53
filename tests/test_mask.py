"""Tests for mask.py, in the attention-gym style.

For every mask factory, at sizes that line up neither with the decoding block nor with
FlexAttention's 128-token tiles, and with q_len != kv_len (the queries are the last q_len keys):
- `dense_mask` equals a brute-force double loop that restates the rule from the design notes
  (docs/design.md sections 1, 3, 4, 5) in plain Python: the real reference, independent of the
  tensor code of the mask_mods;
- `flex_attention` with `block_mask` equals `scaled_dot_product_attention` with `dense_mask`
  (fp32), and the BlockMask's tiles cover every visible key.
Every query row sees at least itself under all these rules, so no row is fully masked.

Run: python -m pytest tests/test_mask.py -q
"""
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

import mask
from training import objective
from mask import dense_mask

SIZES = [97, 130, 191]          # query lengths: off the block grid and off the 128-token tiles


# ------------------------------------------------------------------ the rules, from the text

def ref_block_causal(block_size, prefix, q_len, kv_len):
    """DESIGN 1: a token sees every token of its own block and of earlier blocks. Query i
    sits at key index prefix + i (keys = [cache ; queries])."""
    rows = []
    for i in range(q_len):
        query_block = (prefix + i) // block_size
        rows.append([j // block_size <= query_block for j in range(kv_len)])
    return torch.tensor(rows, dtype=torch.bool)


def ref_simsd_temporal(prefix, n_commit, step, is_slot):
    """DESIGN 3. Queries = [finished block (n_commit) ; section], keys = [cache (prefix) ;
    queries]. Everyone sees the cache and the finished block (the finished block sees nothing
    else); inside the section, with t the step label:
      a data token at t sees data t' <= t and mask slots t' > t,
      a mask slot at t sees data t' < t and mask slots t' >= t."""
    S = len(step)
    q_len, kv_len = n_commit + S, prefix + n_commit + S
    rows = []
    for i in range(q_len):
        row = []
        for j in range(kv_len):
            if j < prefix + n_commit:                 # cache or finished block: visible to all
                row.append(True)
            elif i < n_commit:                        # finished block never sees the section
                row.append(False)
            else:
                a, b = i - n_commit, j - prefix - n_commit
                t, t_key = step[a], step[b]
                if not is_slot[a]:                    # data token at step t
                    row.append(t_key > t if is_slot[b] else t_key <= t)
                else:                                 # mask slot at step t
                    row.append(t_key >= t if is_slot[b] else t_key < t)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool)


def ref_block_copies(prefix, n_commit, block_size, q_len, sees=None):
    """DESIGN 4. Queries = [finished blocks (n_commit) ; copy_0 ; copy_1 ; ...], each copy one
    block long; a copy sees the cache, the finished blocks, itself and the copies sees[q][k]
    names (default none); the finished blocks are block-causal among themselves."""
    kv_len = prefix + q_len
    rows = []
    for i in range(q_len):
        row = []
        for j in range(kv_len):
            if j < prefix:
                row.append(True)
            elif i < n_commit:
                row.append(j < prefix + n_commit and (j - prefix) // block_size <= i // block_size)
            elif j < prefix + n_commit:
                row.append(True)
            else:
                qc, kc = (i - n_commit) // block_size, (j - prefix - n_commit) // block_size
                row.append(qc == kc or bool(sees is not None and sees[qc][kc]))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool)


def copy_tree(n, seed):
    """A random tree of n copies: copy i's parent is an earlier copy or none; -> the (n, n)
    sees matrix, each copy seeing itself and its ancestors, padded to 16 x 16."""
    g = random.Random(seed)
    parent = [-1] + [g.randrange(-1, i) for i in range(1, n)]
    sees = torch.zeros(max(n, 16), max(n, 16), dtype=torch.bool)
    for i in range(n):
        a = i
        while a >= 0:
            sees[i, a], a = True, parent[a]
    return sees


def ref_bd3lm_training(block_size, n):
    """DESIGN 5. Input [x_t ; x_0], 2n tokens. A noisy token of block b sees the noisy tokens
    of block b and the clean tokens of blocks < b; a clean token of block b sees the clean
    tokens of blocks <= b."""
    rows = []
    for i in range(2 * n):
        q_noisy, qb = i < n, (i if i < n else i - n) // block_size
        row = []
        for j in range(2 * n):
            k_noisy, kb = j < n, (j if j < n else j - n) // block_size
            if q_noisy:
                row.append(kb == qb if k_noisy else kb < qb)
            else:
                row.append(False if k_noisy else kb <= qb)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool)


# ------------------------------------------------------------------ cases

def simsd_section(S, gamma, seed):
    """A random SimSD section of S entries laid out as [data ; slots]: data tokens carry
    t = 0 (known) or a drafted step 1..gamma; slots carry a drafted step, or gamma + 1 for
    positions left undrafted this round (after every step). -> (step, is_slot) lists."""
    rng = random.Random(seed)
    n_data = rng.randint(S // 3, 2 * S // 3)
    data = [rng.choice([0, 0] + list(range(1, gamma + 1))) for _ in range(n_data)]
    slots = [rng.choice(list(range(1, gamma + 2))) for _ in range(S - n_data)]
    assert 0 in data and gamma + 1 in slots, "the case must hold known data and undrafted slots"
    return data + slots, [False] * n_data + [True] * (S - n_data)


def cases():
    """(id, mask_mod, reference dense mask, q_len, kv_len)."""
    out = []
    for q_len in SIZES:
        for block_size in (4, 8):
            for prefix in (0, 36, 133):              # 133: off the block grid
                mod = mask.block_causal(block_size, prefix)
                ref = ref_block_causal(block_size, prefix, q_len, prefix + q_len)
                out.append((f"block_causal-B{block_size}-q{q_len}-p{prefix}", mod, ref,
                            q_len, prefix + q_len))
        for prefix, n_commit in ((0, 0), (40, 0), (0, 4), (133, 8)):
            S = q_len - n_commit
            step, is_slot = simsd_section(S, gamma=5, seed=q_len + prefix)
            mod = mask.simsd_temporal(prefix, n_commit, torch.tensor(step), torch.tensor(is_slot))
            ref = ref_simsd_temporal(prefix, n_commit, step, is_slot)
            out.append((f"simsd_temporal-q{q_len}-p{prefix}-c{n_commit}", mod, ref,
                        q_len, prefix + q_len))
        for prefix, n_commit, block_size in ((0, 0, 4), (40, 0, 8), (0, 4, 4), (133, 8, 8)):
            mod = mask.block_copies(prefix, n_commit, block_size, torch.eye(q_len).bool())
            ref = ref_block_copies(prefix, n_commit, block_size, q_len)
            out.append((f"block_copies-B{block_size}-q{q_len}-p{prefix}-c{n_commit}", mod, ref,
                        q_len, prefix + q_len))
        for prefix, n_commit, block_size in ((0, 0, 4), (40, 8, 4), (133, 16, 8)):   # 2 finished
            n = -(-(q_len - n_commit) // block_size)
            sees = copy_tree(n, seed=q_len + prefix)
            mod = mask.block_copies(prefix, n_commit, block_size, sees)
            ref = ref_block_copies(prefix, n_commit, block_size, q_len, sees.tolist())
            out.append((f"block_copies_tree-B{block_size}-q{q_len}-p{prefix}-c{n_commit}", mod, ref,
                        q_len, prefix + q_len))
    for n in (49, 65, 95):                           # 2n = 98, 130, 190
        for block_size in (4, 8):
            out.append((f"bd3lm_training-B{block_size}-n{n}", objective.bd3lm_training(block_size, n),
                        ref_bd3lm_training(block_size, n), 2 * n, 2 * n))
    return out


CASES = cases()
IDS = [c[0] for c in CASES]


# ------------------------------------------------------------------ tests

@pytest.mark.parametrize("name, mod, ref, q_len, kv_len", CASES, ids=IDS)
def test_dense_mask_matches_rule(name, mod, ref, q_len, kv_len):
    dense = mask.dense_mask(mod, q_len, kv_len)
    assert dense.shape == (q_len, kv_len) and dense.dtype == torch.bool
    assert ref.any(-1).all(), "test case must not hold a fully masked row"
    bad = (dense != ref).nonzero()
    assert len(bad) == 0, f"{name}: {len(bad)} entries differ, first (q, kv) = {bad[:5].tolist()}"


@pytest.mark.parametrize("name, mod, ref, q_len, kv_len", CASES, ids=IDS)
def test_flex_matches_sdpa(name, mod, ref, q_len, kv_len):
    g = torch.Generator().manual_seed(q_len * 1000 + kv_len)
    heads, head_dim = 2, 16
    q = torch.randn(1, heads, q_len, head_dim, generator=g)
    k = torch.randn(1, heads, kv_len, head_dim, generator=g)
    v = torch.randn(1, heads, kv_len, head_dim, generator=g)
    bm = mask.block_mask(mod, q_len, kv_len)
    out_flex = flex_attention(q, k, v, block_mask=bm)
    out_sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense_mask(mod, q_len, kv_len))
    torch.testing.assert_close(out_flex, out_sdpa, atol=1e-5, rtol=0)

    # block level: every (128 x 128) tile holding a visible key is in the BlockMask
    tiles = bm.to_dense()[0, 0].bool()
    qb, kb = bm.BLOCK_SIZE
    for i in range(tiles.shape[0]):
        for j in range(tiles.shape[1]):
            if ref[i * qb:(i + 1) * qb, j * kb:(j + 1) * kb].any():
                assert tiles[i, j], f"{name}: tile ({i}, {j}) holds visible keys but is skipped"


def test_block_causal_fused_commit_rows_match_separate_forwards():
    """DESIGN 2, fused commit: with queries [finished block ; next block] at prefix C, each
    row sees exactly what it would in its own forward (finished block at C, next at C + B)."""
    B, C = 4, 12
    fused = mask.dense_mask(mask.block_causal(B, C), 2 * B, C + 2 * B)
    alone_finished = mask.dense_mask(mask.block_causal(B, C), B, C + B)
    alone_next = mask.dense_mask(mask.block_causal(B, C + B), B, C + 2 * B)
    assert torch.equal(fused[:B, :C + B], alone_finished) and not fused[:B, C + B:].any()
    assert torch.equal(fused[B:], alone_next)


def test_simsd_known_data_and_undrafted_slots_are_seen_by_every_section_token():
    """Known data (t = 0) and undrafted slots (label after every step) are visible to every
    section query, as they are the same in every state of plain decoding."""
    gamma = 3
    step = [0, 1, 2, 3, 1, 2, 3, 4]             # data: one known + 3 drafted; slots: 3 + undrafted
    is_slot = [False] * 4 + [True] * 4
    dense = mask.dense_mask(mask.simsd_temporal(5, 0, torch.tensor(step), torch.tensor(is_slot)),
                            8, 13)
    section = dense[:, 5:]
    assert dense[:, :5].all()                                   # the cache
    assert section[:, 0].all()                                  # known data, t = 0
    assert section[:, 7].all() and step[7] == gamma + 1         # undrafted slot
    assert section.diagonal().all()                             # every token sees itself
    # the data token of step 1 sees the slots of steps 2, 3 (still masked then), not its own
    assert section[1, 4:].tolist() == [False, True, True, True]
    # the slot of step 2 sees the data of step 1 only, and the slots of steps >= 2
    assert section[5].tolist() == [True, True, False, False, False, True, True, True]


def test_python_draw_masks_py_draws_every_rule_as_its_dense_mask():
    import subprocess
    import sys
    from tools.draw_masks import draw, examples
    run = subprocess.run([sys.executable, "tools/draw_masks.py"], cwd=ROOT_DIR, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0 and run.stdout.count("\n\n") == len(examples())
    for title, mod, q_len, kv_len, q_labels, kv_groups in examples():
        assert title in run.stdout
        grid = draw(mod, q_len, kv_len, q_labels, kv_groups).splitlines()[1:]
        cells = [[c == "#" for c in line[-2 * kv_len::2]] for line in grid]   # a symbol, a separator
        assert cells == dense_mask(mod, q_len, kv_len).tolist()


def test_the_png_needs_matplotlib_and_a_writable_path(monkeypatch, tmp_path):
    import subprocess
    import sys
    from tools.draw_masks import save_png
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # as if it were not installed
    with pytest.raises(ValueError, match=r"--png needs matplotlib \(pip install matplotlib\)"):
        save_png(tmp_path / "m.png")
    run = subprocess.run([sys.executable, "tools/draw_masks.py", "--png", str(tmp_path / "no" / "m.png")], cwd=ROOT_DIR,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 1 and run.stderr.startswith("error: --png") and run.stderr.count("\n") == 1
    assert not (tmp_path / "no").exists()


ROOT_DIR = Path(__file__).resolve().parents[1]
