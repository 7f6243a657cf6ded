"""The custom ops as PyTorch sees them, without a GPU: CPU kernels computed
by the plain-PyTorch reference are registered for attnres::forward and
attnres::backward (and the device check is relaxed to let CPU tensors
through), so that the real wrappers, fake implementations and registered
autograd run end to end, eagerly and under torch.compile(fullgraph=True).
What this checks is the wiring: shapes, layouts, which gradient goes where.
The kernels themselves are checked on the GPU (test/Integration/GPU/torch_op.py)."""

import os

import pytest

torch = pytest.importorskip("torch")


def _version():
    return tuple(int("".join(c for c in part if c.isdigit()) or 0)
                 for part in torch.__version__.split("+")[0].split(".")[:2])


pytestmark = pytest.mark.skipif(_version() < (2, 4),
                                reason="needs PyTorch >= 2.4")


@pytest.fixture(scope="module")
def cpu_ops():
    import attnres
    from attnres import _checks, ops
    from attnres.reference import (attnres_backward_reference,
                                   attnres_partial_reference,
                                   attnres_reference, o_pre_residual,
                                   partition_reduce_reference)

    def forward(sources, query, key_norm, output_norm, eps, scale, save):
        v = sources[0] if sources[0].dim() == 3 else torch.stack(sources)
        o, lse = attnres_reference(v, query, key_norm_weight=key_norm,
                                   output_norm_weight=None, eps=eps,
                                   scale=scale, return_lse=True)
        o_pre = o
        if output_norm is not None:
            o = attnres_reference(v, query, key_norm_weight=key_norm,
                                  output_norm_weight=output_norm, eps=eps,
                                  scale=scale)
        keep = save == "o_pre" and output_norm is not None
        residual = o_pre_residual(o_pre.float(), v.dtype).contiguous() \
            if _checks.keeps_residual(v.dtype, v.shape[-1], save) else \
            v.new_empty((0,), dtype=torch.int8)
        return (o.contiguous(), lse.contiguous(),
                o_pre.contiguous() if keep else v.new_empty((0,)), residual)

    def backward(sources, query, key_norm, output_norm, grad, lse, saved,
                 saved_residual, eps, scale, save):
        # Autograd is off inside a kernel: the docs/Math.md formulas instead.
        v = sources[0] if sources[0].dim() == 3 else torch.stack(sources)
        dv, dq, dg, dh = attnres_backward_reference(
            v, query, grad, key_norm_weight=key_norm,
            output_norm_weight=output_norm, eps=eps, scale=scale)
        # Absent gradients are distinct empty tensors: outputs must not alias.
        # Dense like the GPU op's (inductor checks strides against the fake).
        return (dv.to(v.dtype).contiguous(), dq.to(query.dtype).contiguous(),
                dg.to(query.dtype) if dg is not None else query.new_empty(0),
                dh.to(query.dtype).contiguous() if dh is not None
                else query.new_empty(0))

    def partial(sources, query, key_norm, eps, scale):
        v = sources[0] if sources[0].dim() == 3 else torch.stack(sources)
        o, lse = attnres_partial_reference(v, query, key_norm_weight=key_norm,
                                           eps=eps, scale=scale)
        return o.contiguous(), lse.contiguous()

    def partial_backward(sources, query, key_norm, grad_o, grad_lse, lse, o,
                         eps, scale):
        v = sources[0] if sources[0].dim() == 3 else torch.stack(sources)
        dv, dq, dg, _ = attnres_backward_reference(
            v, query, grad_o, key_norm_weight=key_norm, eps=eps, scale=scale,
            grad_lse=grad_lse)
        return (dv.to(v.dtype).contiguous(), dq.to(query.dtype).contiguous(),
                dg.to(query.dtype) if dg is not None else query.new_empty(0))

    def merge(partials, lse, sink, output_norm, eps):
        o, merged = partition_reduce_reference(
            partials, lse, output_norm_weight=output_norm, eps=eps)
        dtype = output_norm.dtype if output_norm is not None else \
            torch.float32
        return o.to(dtype).contiguous(), merged.contiguous()

    ops.forward_op.register_kernel("cpu")(forward)
    ops.backward_op.register_kernel("cpu")(backward)
    ops.partial_op.register_kernel("cpu")(partial)
    ops.partial_backward_op.register_kernel("cpu")(partial_backward)
    ops.merge_op.register_kernel("cpu")(merge)
    original = _checks.check_devices
    _checks.check_devices = lambda *args, **kwargs: None
    yield attnres
    _checks.check_devices = original


def _inputs(packed, multi, key_norm, output_norm, per_query, lead=(2, 5),
            L=4, D=32, R=16, M=3, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)
    if packed:
        sources = randn(L, *lead, D).requires_grad_()
        leaves = [sources]
    else:
        sources = [randn(*lead, D).requires_grad_() for _ in range(L)]
        leaves = list(sources)
    query = randn(M, R) if multi else randn(R)
    query.requires_grad_()
    leaves.append(query)
    g = h = None
    if key_norm:
        g = (1 + 0.1 * randn(R)).requires_grad_()
        leaves.append(g)
    if output_norm:
        h = (1 + 0.1 * randn(*((M, D) if per_query else (D,))))
        h.requires_grad_()
        leaves.append(h)
    return sources, query, g, h, leaves


CASES = [
    dict(packed=False, multi=False, key_norm=False, output_norm=False,
         per_query=False),
    dict(packed=True, multi=True, key_norm=True, output_norm=True,
         per_query=True),
    dict(packed=False, multi=True, key_norm=True, output_norm=True,
         per_query=False),
    dict(packed=True, multi=False, key_norm=False, output_norm=True,
         per_query=False),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("save", ["o_pre", "lse"])
@pytest.mark.parametrize("compiled", [False, True])
def test_op_matches_the_reference(cpu_ops, case, save, compiled):
    from attnres.reference import attnres_reference
    attnres = cpu_ops
    sources, query, g, h, leaves = _inputs(**case)

    def run(s, q, g_, h_):
        return attnres.attnres(s, q, key_norm_weight=g_,
                               output_norm_weight=h_, eps=1e-5, scale=0.7,
                               save=save)
    if compiled:
        torch._dynamo.reset()
        run = torch.compile(run, fullgraph=True, backend=os.environ.get("ATTNRES_TEST_BACKEND", "aot_eager"))
    o = run(sources, query, g, h)
    expected = attnres_reference(sources, query, key_norm_weight=g,
                                 output_norm_weight=h, eps=1e-5, scale=0.7)
    assert o.shape == expected.shape
    torch.testing.assert_close(o, expected)
    grad = torch.randn(o.shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(o, leaves, grad)
    want = torch.autograd.grad(expected, leaves, grad)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b)


def test_strided_sources_are_copied(cpu_ops):
    attnres = cpu_ops
    wide = torch.randn(3, 10, 64)
    sources = [wide[i, :, :32] for i in range(3)]   # row stride 64, not 32
    query = torch.randn(32)
    from attnres.reference import attnres_reference
    torch.testing.assert_close(attnres.attnres(sources, query),
                               attnres_reference(sources, query))


@pytest.mark.parametrize("multi", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_partials_merge_through_the_ops(cpu_ops, multi, compiled):
    # attnres::partial (and its backward, given the lse's gradient by the
    # merge) and attnres::merge wired end to end, against the reference of
    # the whole op.
    from attnres.reference import attnres_reference
    attnres = cpu_ops
    sources, query, g, h, leaves = _inputs(
        packed=True, multi=multi, key_norm=True, output_norm=True,
        per_query=False, L=5)

    def run(s, q, g_, h_):
        parts = [attnres.attnres_partial(part, q, key_norm_weight=g_,
                                         eps=1e-5, scale=0.7)
                 for part in torch.split(s, [2, 3])]
        o, _ = attnres.partition_reduce(
            torch.stack([p[0] for p in parts]),
            torch.stack([p[1] for p in parts]), output_norm_weight=h_,
            eps=1e-5)
        return o
    if compiled:
        torch._dynamo.reset()
        run = torch.compile(run, fullgraph=True, backend=os.environ.get(
            "ATTNRES_TEST_BACKEND", "aot_eager"))
    o = run(sources, query, g, h)
    expected = attnres_reference(sources, query, key_norm_weight=g,
                                 output_norm_weight=h, eps=1e-5, scale=0.7)
    torch.testing.assert_close(o, expected)
    grad = torch.randn(o.shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(o, leaves, grad)
    want = torch.autograd.grad(expected, leaves, grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
