"""The PyTorch ops' argument checks, on tensor look-alikes: every rule has
its message, and a valid call maps to the right compiler spec."""

import pytest

from attnres import InvalidArgumentError
from attnres._checks import (check_attnres, check_gradient_buffer,
                             check_partition_reduce)
from fakes import Tensor


def call(sources=None, query=None, g=None, h=None, eps=1e-6, scale=1.0,
         save="o_pre", cuda=True):
    if sources is None:
        sources = [Tensor((2, 16, 64)) for _ in range(3)]
    if query is None:
        query = Tensor((64,))
    return check_attnres(sources, query, g, h, eps, scale, save,
                         cuda_available=cuda)


def test_valid_list_call():
    c = call(h=Tensor((64,)), g=Tensor((32,)), query=Tensor((32,)))
    assert (c.L, c.D, c.R, c.M, c.N, c.lead) == (3, 64, 32, 1, 32, (2, 16))
    assert not c.packed and not c.multi_query
    assert c.spec() == ("train:L=3,D=64,R=32,M=1,dtype=bf16,multi_query,"
                        "key_norm,output_norm,save=o_pre_residual,"
                        "eps=1e-06,scale=1.0")


def test_valid_packed_multi_query_call():
    c = call(sources=Tensor((5, 7, 128), "float16"),
             query=Tensor((4, 128), "float32"), h=Tensor((4, 128), "float32"),
             save="lse", scale=0.5)
    assert (c.L, c.N, c.M, c.packed, c.per_query) == (5, 7, 4, True, True)
    assert c.spec() == ("train:L=5,D=128,R=128,M=4,dtype=f16,multi_query,"
                        "param_dtype=f32,output_norm=per_query,save=lse,"
                        "eps=1e-06,scale=0.5")


@pytest.mark.parametrize("dtype, width, residual", [
    ("bfloat16", 64, True), ("float16", 64, True),
    # No residual where it cannot help (f32) or pack (an odd D).
    ("float32", 64, False), ("bfloat16", 63, False)])
def test_o_pre_residual_rule(dtype, width, residual):
    c = call(sources=[Tensor((2, 16, width), dtype) for _ in range(3)],
             query=Tensor((width,), dtype))
    assert c.residual is residual
    assert ("save=o_pre_residual" in c.spec()) is residual
    lse = call(sources=[Tensor((2, 16, width), dtype) for _ in range(3)],
               query=Tensor((width,), dtype), save="lse")
    assert not lse.residual and "save=lse" in lse.spec()


@pytest.mark.parametrize("kwargs, message", [
    (dict(sources=[]), "at least one source"),
    (dict(sources="x"), "sources must be a list of tensors or one packed"),
    (dict(sources=[Tensor((4, 8)), 3]), "sources[1] must be a torch.Tensor"),
    (dict(sources=[Tensor((8,))]), "at least one token dimension"),
    (dict(sources=Tensor((4, 8))), "packed sources must be [L, ..., D]"),
    (dict(sources=[Tensor((4, 64)), Tensor((5, 64))]),
     "sources[0] is [4, 64], sources[1] is [5, 64]"),
    (dict(sources=[Tensor((4, 64)), Tensor((4, 64), "float16")]),
     "sources[0] is torch.bfloat16, sources[1] is torch.float16"),
    (dict(sources=[Tensor((4, 64), "int32")]),
     "bfloat16, float16 or float32, got torch.int32"),
    (dict(query=Tensor((2, 2, 64))), "query must be [R] or [M, R]"),
    (dict(query=Tensor((17, 64))), "M = 17 queries; attnres takes 1 to 16"),
    (dict(query=Tensor((65,))), "rank R = 65 must be in [1, D = 64]"),
    (dict(query=Tensor((0,))), "rank R = 0 must be in [1, D = 64]"),
    (dict(query=Tensor((64,), "float16")),
     "query must have the sources' dtype (torch.bfloat16) or float32"),
    (dict(g=Tensor((32,))), "key_norm_weight must be [R] = [64], got [32]"),
    (dict(g=Tensor((64,), "float32")),
     "key_norm_weight must have the query's dtype"),
    (dict(h=Tensor((2, 64))), "output_norm_weight must be [D] = [64], got"),
    (dict(query=Tensor((2, 64)), h=Tensor((3, 64))),
     "output_norm_weight must be [D] = [64] or [M, D] = [2, 64]"),
    (dict(h=Tensor((64,), "float32")),
     "output_norm_weight must have the query's dtype"),
    (dict(eps=0.0), "eps must be a finite number > 0"),
    (dict(eps=float("nan")), "eps must be a finite number > 0"),
    (dict(eps=True), "eps must be a finite number > 0"),
    (dict(scale=float("inf")), "scale must be a finite number"),
    (dict(save="o"), "save must be 'o_pre'"),
    (dict(sources=[Tensor((4, 64), device="cpu")], cuda=False),
     "sources[0] is on cpu; attnres runs on CUDA or ROCm GPUs: move the "
     "tensors there with .cuda() (and this PyTorch sees no CUDA"),
    (dict(query=Tensor((64,), device="cuda:1")),
     "query is on cuda:1 but sources[0] is on cuda:0"),
    (dict(h=Tensor((64,), device="cpu")),
     "output_norm_weight is on cpu but sources[0] is on cuda:0"),
])
def test_errors(kwargs, message):
    with pytest.raises((InvalidArgumentError, TypeError)) as raised:
        call(**kwargs)
    assert message in str(raised.value)


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError, match="query must be a torch.Tensor"):
        call(query=[1.0] * 64)


def merge(partials=None, lse=None, sink=None, h=None, eps=1e-6,
          mode="softmax"):
    if partials is None:
        partials = Tensor((4, 3, 8, 64), "float32")
    if lse is None and mode == "softmax":
        lse = Tensor(partials.shape[:-1], "float32")
    return check_partition_reduce(partials, lse, sink, h, eps, mode)


def test_valid_merges():
    c = merge(sink=Tensor((3, 8), "float32"), h=Tensor((64,), "bfloat16"))
    assert (c.P, c.rows, c.D, c.out_type, c.sink) == (4, 24, 64, "bf16", True)
    c = merge(partials=Tensor((5, 6, 7), "float32"), mode="sum")
    assert (c.P, c.shape) == (5, (6, 7))


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="max"), "mode must be 'softmax' or 'sum'"),
    (dict(partials=Tensor((4, 8, 64))), "partials must be float32"),
    (dict(partials=Tensor((4, 64), "float32")),
     "partials of a softmax merge must be [P, ..., D]"),
    (dict(lse=Tensor((4, 3, 9), "float32")),
     "lse must be float32 [4, 3, 8] (partials without D)"),
    (dict(sink=Tensor((3,), "float32")), "sink must be float32 [3, 8]"),
    (dict(h=Tensor((32,))), "output_norm_weight must be [D] = [64]"),
    (dict(h=Tensor((64,), "int8")),
     "output_norm_weight must be bfloat16, float16 or float32"),
    (dict(eps=-1.0), "eps must be a finite number > 0"),
    (dict(partials=Tensor((4, 3), "float32"), lse=Tensor((4,), "float32"),
          mode="sum"), "lse is only for mode='softmax'"),
    (dict(partials=Tensor((4,), "float32"), mode="sum"),
     "partials of a sum must be [P, ...]"),
    (dict(lse=Tensor((4, 3, 8), "float32", device="cuda:1")),
     "lse is on cuda:1 but partials is on cuda:0"),
])
def test_merge_errors(kwargs, message):
    with pytest.raises(InvalidArgumentError) as raised:
        merge(**kwargs)
    assert message in str(raised.value)


def test_softmax_merge_needs_lse():
    with pytest.raises(InvalidArgumentError, match="needs the partials' lse"):
        check_partition_reduce(Tensor((2, 3, 8), "float32"), None, None, None,
                               1e-6, "softmax")


class _Strided(Tensor):
    """A view with gaps between its rows (a slice of a wider tensor)."""

    def stride(self):
        strides = list(super().stride())
        strides[0] *= 2
        return tuple(strides)


class _Misaligned(Tensor):
    """A view starting 8 bytes into its storage."""

    def data_ptr(self):
        return super().data_ptr() + 8


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("buffer, got", [
    (Tensor((2, 16, 64)), r"\[2, 16, 64\] torch.bfloat16 on cuda:0"),
    (Tensor((3, 16, 32)), r"\[3, 16, 32\] torch.bfloat16 on cuda:0"),
    (Tensor((3, 16, 64), "float16"), r"\[3, 16, 64\] torch.float16 on cuda:0"),
    (Tensor((3, 16, 64), device="cuda:1"),
     r"\[3, 16, 64\] torch.bfloat16 on cuda:1"),
    (_Strided((3, 16, 64)), r"\[3, 16, 64\] torch.bfloat16 on cuda:0 "
                            r"\(not dense\)"),
    (_Misaligned((3, 16, 64)), r"\[3, 16, 64\] torch.bfloat16 on cuda:0 "
                               r"\(not 16-byte aligned\)"),
])
def test_a_wrong_gradient_buffer_is_named(packed, buffer, got):
    sources = Tensor((3, 16, 64)) if packed else \
        [Tensor((16, 64)) for _ in range(3)]
    if packed:
        sources = [sources]
    with pytest.raises(InvalidArgumentError,
                       match=r"grad_sources must be a dense, 16-byte "
                             r"aligned \[3, 16, 64\] torch.bfloat16 tensor "
                             r"on cuda:0, got " + got):
        check_gradient_buffer(sources, buffer)


@pytest.mark.parametrize("shape", [(3, 16, 64), (3, 1, 64)])
def test_a_dense_gradient_buffer_is_taken(shape):
    sources = [Tensor(shape[1:]) for _ in range(3)]
    check_gradient_buffer(sources, Tensor(shape))
