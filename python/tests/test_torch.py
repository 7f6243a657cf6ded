"""The PyTorch functions on a machine without a GPU: real tensors get the
argument errors; where PyTorch >= 2.4 is installed, the custom ops' fake
implementations give every output and gradient its shape and dtype."""

import pytest

torch = pytest.importorskip("torch")

import attnres  # noqa: E402
from attnres import InvalidArgumentError  # noqa: E402


def _version():
    return tuple(int("".join(c for c in part if c.isdigit()) or 0)
                 for part in torch.__version__.split("+")[0].split(".")[:2])


def sources(count=3, shape=(2, 8, 64), dtype=torch.bfloat16, device="cpu"):
    return [torch.randn(shape, dtype=dtype, device=device)
            for _ in range(count)]


def test_cpu_tensors_are_refused():
    with pytest.raises(InvalidArgumentError) as raised:
        attnres.attnres(sources(), torch.randn(64, dtype=torch.bfloat16))
    message = str(raised.value)
    assert "sources[0] is on cpu; attnres runs on CUDA or ROCm GPUs" in message
    if not torch.cuda.is_available():
        assert "this PyTorch sees no CUDA or ROCm GPU" in message


@pytest.mark.parametrize("make, message", [
    (lambda: (sources(dtype=torch.float64), torch.randn(64)),
     "bfloat16, float16 or float32, got torch.float64"),
    (lambda: (sources() + [torch.randn(2, 8, 32, dtype=torch.bfloat16)],
              torch.randn(64, dtype=torch.bfloat16)),
     "sources[0] is [2, 8, 64], sources[3] is [2, 8, 32]"),
    (lambda: (sources(), torch.randn(3, 4, 64, dtype=torch.bfloat16)),
     "query must be [R] or [M, R]"),
    (lambda: (sources(), torch.randn(64, dtype=torch.float16)),
     "query must have the sources' dtype"),
    (lambda: (torch.randn(8, 64, dtype=torch.bfloat16),
              torch.randn(64, dtype=torch.bfloat16)),
     "packed sources must be [L, ..., D]"),
])
def test_wrong_tensors(make, message):
    srcs, query = make()
    with pytest.raises(InvalidArgumentError) as raised:
        attnres.attnres(srcs, query)
    assert message in str(raised.value)


@pytest.mark.parametrize("make, message", [
    (lambda: (sources(), torch.randn(64, dtype=torch.bfloat16)),
     "sources[0] is on cpu; attnres runs on CUDA or ROCm GPUs"),
    (lambda: (sources(dtype=torch.float64), torch.randn(64)),
     "bfloat16, float16 or float32, got torch.float64"),
    (lambda: (sources(), torch.randn(17, 64, dtype=torch.bfloat16)),
     "query has M = 17 queries"),
    (lambda: (sources(), torch.randn(65, dtype=torch.bfloat16)),
     "query rank R = 65 must be in [1, D = 64]"),
])
def test_partial_errors(make, message):
    # attnres_partial checks its arguments as attnres does, before any
    # kernel or the custom ops are needed.
    srcs, query = make()
    with pytest.raises(InvalidArgumentError) as raised:
        attnres.attnres_partial(srcs, query)
    assert message in str(raised.value)


def test_partial_key_norm_shape():
    query = torch.randn(64, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match=r"key_norm_weight must be "
                       r"\[R\] = \[64\], got \[32\]"):
        attnres.attnres_partial(sources(), query, key_norm_weight=torch.ones(
            32, dtype=torch.bfloat16))


def test_partition_reduce_errors():
    with pytest.raises(InvalidArgumentError, match="partials must be float32"):
        attnres.partition_reduce(torch.randn(2, 4, 8, dtype=torch.float16),
                                 torch.randn(2, 4))
    with pytest.raises(InvalidArgumentError, match="partials is on cpu"):
        attnres.partition_reduce(torch.randn(2, 4, 8), torch.randn(2, 4))


@pytest.mark.skipif(_version() >= (2, 4), reason="PyTorch >= 2.4")
def test_old_pytorch_is_named():
    with pytest.raises(ImportError, match="need PyTorch >= 2.4"):
        import attnres.ops  # noqa: F401


@pytest.mark.skipif(_version() < (2, 4), reason="needs PyTorch >= 2.4")
def test_fake_implementations():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        srcs = sources(shape=(2, 8, 64), device="cuda")
        packed = torch.randn(3, 2, 8, 64, dtype=torch.bfloat16, device="cuda")
        query = torch.randn(4, 32, dtype=torch.bfloat16, device="cuda")
        h = torch.randn(4, 64, dtype=torch.bfloat16, device="cuda")
        o = attnres.attnres(srcs, query, output_norm_weight=h)
        assert (o.shape, o.dtype) == ((4, 2, 8, 64), torch.bfloat16)
        o = attnres.attnres(packed, query[0], save="lse")
        assert o.shape == (2, 8, 64)
        ops = torch.ops.attnres
        flat = [s.reshape(16, 64) for s in srcs]
        o, lse, o_pre, residual = ops.forward(flat, query, None, h, 1e-6,
                                              1.0, "o_pre")
        assert (lse.shape, lse.dtype, o_pre.shape) == \
            ((4, 16), torch.float32, (4, 16, 64))
        # bf16 with an even D: o_pre's residual, two 4-bit values a byte.
        assert (residual.shape, residual.dtype) == ((4, 16, 32), torch.int8)
        grads = ops.backward(flat, query, None, h, o, lse, o_pre, residual,
                             1e-6, 1.0, "o_pre")
        assert [tuple(g.shape) for g in grads] == \
            [(3, 16, 64), (4, 32), (0,), (4, 64)]
        partials = torch.randn(5, 2, 8, 64, device="cuda")
        merged, merged_lse = attnres.partition_reduce(
            partials, torch.randn(5, 2, 8, device="cuda"))
        assert (merged.shape, merged_lse.shape) == ((2, 8, 64), (2, 8))
        total = attnres.partition_reduce(partials, mode="sum")
        assert total.shape == (2, 8, 64)
        # Partial results: FP32 o and lse; their backward gives each input
        # its gradient's shape.
        o, lse = attnres.attnres_partial(packed, query)
        assert (o.shape, o.dtype, lse.shape) == \
            ((4, 2, 8, 64), torch.float32, (4, 2, 8))
        grads = ops.partial_backward(flat, query, None, o.reshape(4, 16, 64),
                                     lse.reshape(4, 16), lse.reshape(4, 16),
                                     o.reshape(4, 16, 64), 1e-6, 1.0)
        assert [tuple(g.shape) for g in grads] == [(3, 16, 64), (4, 32),
                                                   (0,)]


@pytest.mark.skipif(_version() < (2, 4),
                    reason="the eager path needs PyTorch >= 2.4")
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("skips", [True, False])
def test_null_gradient_entries_only_where_the_backward_skips_them(
        monkeypatch, packed, skips):
    """The eager backward's table of gradient rows, for sources some of
    which need no gradient: null entries for those where the bundle's
    backward skips them; else a row for every source, the unwanted ones
    dropped (a kernel from before the fact would store through a null
    entry). The launch itself is replaced: no GPU needed."""
    import types
    from attnres import ops
    tables = []
    monkeypatch.setattr(ops, "_pointer_table",
                        lambda pointers, device, packed=None:
                        tables.append(pointers) or object())
    monkeypatch.setattr(ops, "_launch_backward_into",
                        lambda *args: ("dq", "dg", "dh"))
    plan = types.SimpleNamespace(
        packed=packed, grad_shape=(3, 8, 64), device=torch.device("cpu"),
        backward=types.SimpleNamespace(skips_null_gradients=skips))
    srcs = [torch.randn(3, 8, 64)] if packed else sources(3, (8, 64))
    wanted = (False,) if packed else (True, False, True)
    per_source, dq, dg, dh = ops._launch_backward(
        plan, None, srcs, None, None, None, None, None, None, None, wanted)
    assert (dq, dg, dh) == ("dq", "dg", "dh")
    assert [g is not None for g in per_source] == list(wanted)
    assert all(g.shape == (8, 64) for g in per_source if g is not None)
    (pointers,) = tables
    assert len(pointers) == 3
    assert (0 in pointers) == skips
