"""Masking and MaskGIT decoding (hyperset.vision.maskgit)."""

import math

import pytest
import torch

from hyperset.vision.maskgit import MODES, decode, mask_by_ratio, random_token_mask, schedule

MASK_ID = 16
V = 16




def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_random_token_mask_mean_fraction_is_half_the_max_ratio():
    m = random_token_mask((4000, 64), max_ratio=0.4, generator=_gen())
    assert m.dtype == torch.bool and m.shape == (4000, 64)
    assert abs(m.float().mean().item() - 0.2) < 0.01
    per_sample = m.float().mean(1)
    assert per_sample.max() <= 0.75  # no sample is masked far beyond 0.4
    assert per_sample.std() > 0.05  # the rate varies per sample (r ~ U(0, 1))


def test_random_token_mask_keeps_grid_shape():
    assert random_token_mask((3, 8, 8), generator=_gen()).shape == (3, 8, 8)


@pytest.mark.parametrize("ratio,expected", [(0.1, 26), (0.2, 51), (0.3, 77), (0.4, 102), (0, 0), (1, 256)])
def test_mask_by_ratio_masks_exact_count_per_sample(ratio, expected):
    m = mask_by_ratio((50, 16, 16), ratio, generator=_gen())
    assert m.shape == (50, 16, 16)
    assert (m.flatten(1).sum(1) == expected).all()


def test_mask_by_ratio_positions_differ_between_samples():
    m = mask_by_ratio((8, 64), 0.5, generator=_gen())
    assert len({tuple(row.tolist()) for row in m}) == 8


SCHEDULE_CASES = [(24, 256), (8, 256), (12, 102), (24, 26), (24, 3), (5, 1), (1, 40), (3, 0)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("steps,n", SCHEDULE_CASES)
def test_schedule_sums_exactly_and_is_non_negative(mode, steps, n):
    s = schedule(steps, n, mode)
    assert s.shape == (steps,) and s.dtype == torch.long
    assert int(s.sum()) == n
    assert (s >= 0).all()


def test_arccos_schedule_matches_maskgit_shape():
    s = schedule(8, 256, "arccos")
    r = torch.linspace(1, 0, 8, dtype=torch.float64)
    v = torch.arccos(r) / (math.pi / 2)
    ref = (v / v.sum() * 256).round().long()
    ref[ref == 0] = 1
    ref[-1] += 256 - ref.sum()
    assert torch.equal(s, ref)
    assert s[0] == 1 and s[-1] > s[1]  # starts slow, reveals most at the end


def test_schedule_rejects_unknown_mode():
    with pytest.raises(ValueError, match="unknown schedule mode"):
        schedule(8, 64, "exponential")


def _dummy_logits(codes: torch.Tensor) -> torch.Tensor:
    """Prefers token (position mod V), and counts how often it is called."""
    b, n = codes.shape
    assert (codes <= MASK_ID).all()
    target = torch.arange(n) % V
    logits = torch.zeros(b, n, V + 1)
    logits[:, torch.arange(n), target] = 5.0
    logits[..., MASK_ID] = 100.0  # the mask class must never be sampled
    return logits


def test_decode_fills_masked_tokens_and_keeps_the_rest():
    codes = torch.randint(0, V, (4, 8, 8), generator=_gen(1))
    mask = mask_by_ratio(codes.shape, 0.4, generator=_gen(2))
    out = decode(_dummy_logits, codes, mask, MASK_ID, steps=12, temperature=0.0)
    assert out.shape == codes.shape
    assert (out < V).all()
    assert torch.equal(out[~mask], codes[~mask])
    target = (torch.arange(64) % V).view(8, 8).expand(4, 8, 8)
    assert torch.equal(out[mask], target[mask])  # argmax decoding picks the preferred token


def test_decode_handles_different_masked_counts_and_a_blank_canvas():
    codes = torch.randint(0, V, (3, 64), generator=_gen(1))
    mask = torch.zeros(3, 64, dtype=torch.bool)
    mask[0, :5] = True
    mask[1, :40] = True
    mask[2] = True  # generation from nothing
    history = []
    out = decode(_dummy_logits, codes, mask, MASK_ID, steps=8, generator=_gen(3),
                 on_step=lambda step, c: history.append((step, c)))
    assert (out < V).all()
    assert torch.equal(out[~mask], codes[~mask])
    assert [s for s, _ in history] == list(range(8))
    unknown_per_step = torch.stack([(c == MASK_ID).sum(1) for _, c in history])  # (steps, B)
    for i, n in enumerate([5, 40, 64]):
        revealed = torch.cat([torch.tensor([n]), unknown_per_step[:, i]])
        assert torch.equal(n - unknown_per_step[:, i], schedule(8, n).cumsum(0))
        assert (revealed[1:] <= revealed[:-1]).all()
    assert (unknown_per_step[-1] == 0).all()


def test_decode_reveals_most_confident_tokens_first():
    def logits_fn(codes):
        b, n = codes.shape
        logits = torch.zeros(b, n, V)
        logits[:, :, 0] = torch.arange(n, dtype=torch.float)  # later positions are more confident
        return logits

    states = []
    decode(logits_fn, torch.zeros(1, 16, dtype=torch.long), torch.ones(1, 16, dtype=torch.bool), MASK_ID,
           steps=4, temperature=0.0, mode="linear", on_step=lambda s, c: states.append(c))
    first = (states[0][0] != MASK_ID).nonzero().squeeze(1)
    assert first.numel() == int(schedule(4, 16, "linear")[0])
    assert first.min() >= 16 - first.numel()


def test_decode_is_deterministic_with_a_seeded_generator():
    def logits_fn(codes):
        return torch.randn(codes.shape[0], codes.shape[1], V, generator=_gen(7))

    codes = torch.zeros(2, 64, dtype=torch.long)
    mask = torch.ones(2, 64, dtype=torch.bool)
    a = decode(logits_fn, codes, mask, MASK_ID, steps=6, randomize_temp=4.5, generator=_gen(5))
    b = decode(logits_fn, codes, mask, MASK_ID, steps=6, randomize_temp=4.5, generator=_gen(5))
    c = decode(logits_fn, codes, mask, MASK_ID, steps=6, randomize_temp=4.5, generator=_gen(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_decode_temperature_is_a_true_temperature():
    def logits_fn(codes):
        logits = torch.zeros(codes.shape[0], codes.shape[1], V)
        logits[..., 3] = 2.0
        return logits

    codes = torch.zeros(200, 16, dtype=torch.long)
    mask = torch.ones_like(codes, dtype=torch.bool)
    # one step reveals everything at once, so the token frequencies are the sampling probabilities
    cold = decode(logits_fn, codes, mask, MASK_ID, steps=1, temperature=0.2, generator=_gen(0))
    hot = decode(logits_fn, codes, mask, MASK_ID, steps=1, temperature=5.0, generator=_gen(0))
    assert (cold == 3).float().mean() > 0.99  # p = e^10 / (15 + e^10)
    assert abs((hot == 3).float().mean() - 0.090) < 0.03  # p = e^0.4 / (15 + e^0.4)
