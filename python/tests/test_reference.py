"""attnres.reference: the float32 residual of a 16-bit o_pre (what the GPU
tests compare the kernels' residuals with), and the properties of the
backward formulas a deferred backward of a residual history relies on."""

import pytest

torch = pytest.importorskip("torch")

from attnres.reference import decode_o_pre, o_pre_residual  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_residual_restores_14_times_the_precision(dtype):
    generator = torch.Generator().manual_seed(0)
    exact = torch.randn(64, 256, generator=generator) * 3.0
    rounded = exact.to(dtype)
    residual = o_pre_residual(exact, dtype)
    assert (residual.shape, residual.dtype) == ((64, 128), torch.int8)
    decoded = decode_o_pre(rounded, residual)
    bits = 7 if dtype == torch.bfloat16 else 10
    # ulp(x) = 2^(e - p) with x = 1.f * 2^e: |x| >= 2^e. Within ulp/28,
    # plus the float32 rounding of the decoded value.
    ulp = torch.exp2(torch.floor(torch.log2(rounded.float().abs())) - bits)
    bound = ulp / 28 + exact.abs() * 2.0 ** -23
    assert ((decoded - exact).abs() <= bound).all()
    assert ((rounded.float() - exact).abs() > ulp / 28).any()


def test_residual_layout_and_edges():
    # Element 2j in the low four bits, 2j + 1 in the high four bits; 0 for
    # zero, infinity and NaN.
    one = 1.0 + 2.0 ** -8  # halfway between two bf16 values: +7 or -7
    exact = torch.tensor([[1.0, one, 0.0, float("inf"), float("nan"), 1.0]])
    residual = o_pre_residual(exact, torch.bfloat16)
    low, high = int(residual[0, 0]) & 0xF, (int(residual[0, 0]) >> 4) & 0xF
    assert low == 0 and high in (7, 9)  # +7 or -7 in two's complement
    assert residual[0, 1].item() == 0 and residual[0, 2].item() == 0
    decoded = decode_o_pre(exact.to(torch.bfloat16), residual)
    assert decoded[0, 1].item() == pytest.approx(one, abs=2.0 ** -7 / 28)
    assert decoded[0, 3].item() == float("inf")
    assert torch.isnan(decoded[0, 4])


# --- what a deferred (paired) backward of a residual history relies on -----
# (docs/Performance.md, "A whole model"; benchmarks/deferral.py)

F64 = torch.float64
EPS, SCALE = 1e-5, 1.3


def _read(L, seed, M=None):
    generator = torch.Generator().manual_seed(seed)
    shape = (M, 64) if M else (64,)
    sources = torch.randn(L, 5, 64, generator=generator, dtype=F64)
    query = torch.randn(*shape, generator=generator, dtype=F64) * 0.3
    key_norm = 1 + 0.2 * torch.randn(64, generator=generator, dtype=F64)
    grad = torch.randn(*((M,) if M else ()), 5, 64, generator=generator,
                       dtype=F64)
    return sources, query, key_norm, grad


def test_a_backward_over_some_sources_is_their_share_of_the_whole():
    # Given the whole forward's lse and o_pre, backwards over a split of the
    # sources give the whole backward's source gradients and split its
    # query's and key norm's gradients into a sum.
    from attnres.reference import attnres_backward_reference, \
        attnres_reference
    sources, query, key_norm, grad = _read(L=6, seed=0)
    o, lse = attnres_reference(sources, query, key_norm_weight=key_norm,
                               eps=EPS, scale=SCALE, return_lse=True)
    whole = attnres_backward_reference(sources, query, grad,
                                       key_norm_weight=key_norm, eps=EPS,
                                       scale=SCALE)
    parts = [attnres_backward_reference(
        sources[rows], query, grad, key_norm_weight=key_norm, eps=EPS,
        scale=SCALE, lse=lse, o_pre=o) for rows in (slice(0, 2),
                                                     slice(2, 6))]
    torch.testing.assert_close(torch.cat([p[0] for p in parts]), whole[0])
    for index in (1, 2):  # dq, dg
        torch.testing.assert_close(parts[0][index] + parts[1][index],
                                   whole[index])
        assert parts[0][index].abs().max() > 1e-3  # both parts contribute
    # Without the whole forward's lse and o_pre a part is its own read.
    alone = attnres_backward_reference(sources[:2], query, grad,
                                       key_norm_weight=key_norm, eps=EPS,
                                       scale=SCALE)
    assert (alone[0] - parts[0][0]).abs().max() > 1e-3


def test_reads_with_their_own_key_norms_as_one_pass_with_q_times_g():
    # A read's logits depend on its query and key-norm weight only through
    # q * g: two reads with their own weights run as one two-query pass
    # with queries q_m g_m and a weight of ones; the rows' gradients are the
    # two reads' sum, and dq = g dq', dg = q dq'.
    from attnres.reference import attnres_backward_reference
    sources, q0, g0, do0 = _read(L=4, seed=1)
    _, q1, g1, do1 = _read(L=4, seed=2)
    reads = [attnres_backward_reference(sources, q, do, key_norm_weight=g,
                                        eps=EPS, scale=SCALE)
             for q, g, do in ((q0, g0, do0), (q1, g1, do1))]
    dv, dq, _, _ = attnres_backward_reference(
        sources, torch.stack([q0 * g0, q1 * g1]), torch.stack([do0, do1]),
        key_norm_weight=torch.ones(64, dtype=F64), eps=EPS, scale=SCALE)
    torch.testing.assert_close(dv, reads[0][0] + reads[1][0])
    for m, (q, g) in enumerate(((q0, g0), (q1, g1))):
        torch.testing.assert_close(g * dq[m], reads[m][1])
        torch.testing.assert_close(q * dq[m], reads[m][2])
