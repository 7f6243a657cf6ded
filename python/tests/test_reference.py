"""The float32 residual of a 16-bit o_pre (attnres.reference): what the
GPU tests compare the kernels' residuals with."""

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
