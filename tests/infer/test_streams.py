"""Counter-based per-request streams and the two-level inverse-CDF sampler (no per-request kernels, no (rows, V)
float64 tensor): a request's numbers depend only on its key and counter, and the sampled law is the given one."""

import torch
from infer_helpers import chi2_pvalue

from dspark_lightning.infer.acceptance.sampling import CHUNK, SamplingParams, Streams, sample


def test_a_rows_numbers_depend_on_its_key_and_counter_only():
    together = Streams([11, 22, 33], [0, 5, 9], "cpu").draw(6)
    alone = Streams([22], [5], "cpu").draw(6)
    assert torch.equal(together[1], alone[0])
    split = Streams([22], [5], "cpu")
    assert torch.equal(torch.cat([split.draw(2), split.draw(4)], 1), alone) and split.used == 6
    later = Streams([22], [7], "cpu").draw(4)  # a counter moved on by 2 continues the same sequence
    assert torch.equal(later, alone[:, 2:])
    assert not torch.equal(Streams([23], [5], "cpu").draw(6), alone)


def test_uniforms_are_uniform_and_float64_has_fine_resolution():
    u = Streams([7, 8], [0, 0], "cpu").draw(100_000, torch.float64)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    for row in u:
        counts = torch.histc(row.float(), bins=20, min=0.0, max=1.0)
        assert chi2_pvalue(counts, torch.full((20,), 0.05)) > 1e-3
    assert torch.unique(u).numel() == u.numel()  # 53 random bits: no repeats in 200 k draws
    assert abs(float((u[0] * u[1]).mean()) - 0.25) < 0.01  # rows (keys) uncorrelated


def test_two_level_sampler_draws_the_law_across_chunk_boundaries():
    V = 2 * CHUNK + 37  # a last, partial chunk
    p = torch.zeros(V)
    p[CHUNK - 1], p[CHUNK], p[V - 1], p[3] = 0.3, 0.2, 0.4, 0.1  # masses at both sides of a boundary and the end
    rows = 4000
    st = Streams(list(range(rows)), [0] * rows, "cpu")
    x = sample(p.expand(rows, V), SamplingParams(1.0), st)
    counts = torch.bincount(x, minlength=V).float()
    assert counts[p == 0].sum() == 0  # a zero-probability token is never drawn
    keep = p > 0
    assert chi2_pvalue(counts[keep], p[keep]) > 1e-3
    dense = torch.softmax(torch.randn(V) * 2, -1)
    y = sample(dense.expand(rows, V), SamplingParams(1.0), Streams(list(range(rows)), [1] * rows, "cpu"))
    assert chi2_pvalue(torch.bincount(y, minlength=V).float(), dense) > 1e-3


def test_greedy_acceptance_reads_logits_as_it_read_the_one_hot_law():
    from dspark_lightning.infer import accept
    from dspark_lightning.infer.acceptance.sampling import probs, target_law

    g, V, R = 4, 50, 64
    torch.manual_seed(0)
    z = torch.randn(R, g + 1, V)
    drafts = torch.where(torch.rand(R, g) < 0.7, z[:, :g].argmax(-1), torch.randint(0, V, (R, g)))
    greedy = SamplingParams(0.0)
    assert target_law(z, greedy) is not None and target_law(z, greedy).shape == z.shape
    assert not torch.equal(target_law(z, greedy), probs(z, greedy))  # logits, not a one-hot
    ell = torch.randint(0, g + 1, (R,))
    a = accept(drafts, None, target_law(z, greedy), ell, greedy)
    b = accept(drafts, None, probs(z, greedy), ell, greedy)
    assert torch.equal(a.accepted, b.accepted) and torch.equal(a.next_token, b.next_token)
    assert int(a.accepted.sum()) > 0
