"""Partial results and their merge, on the CPU: the partials of any split of
the sources merge into AttnRes over all of them (values and gradients, in
float64), the lse's gradient enters the backward formulas as docs/Math.md
says, and attnres.distributed.sharded_attnres over two gloo processes equals
the single-process op. The compiled kernels are checked on the GPU
(test/Integration/GPU/torch_op.py)."""

import os
import socket

import pytest

torch = pytest.importorskip("torch")

from attnres.reference import (attnres_backward_reference,  # noqa: E402
                               attnres_partial_reference, attnres_reference,
                               partition_reduce_reference)

F64 = torch.float64


def _problem(L=6, lead=(3, 4), D=12, R=8, M=None, key_norm=True,
             output_norm="shared", seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)
    sources = randn(L, *lead, D).requires_grad_()
    query = (randn(R) if M is None else randn(M, R)).requires_grad_()
    g = (1 + 0.1 * randn(R)).requires_grad_() if key_norm else None
    h = None
    if output_norm == "shared":
        h = (1 + 0.1 * randn(D)).requires_grad_()
    elif output_norm == "per_query":
        h = (1 + 0.1 * randn(M, D)).requires_grad_()
    return sources, query, g, h


def _leaves(*tensors):
    return [t for t in tensors if t is not None]


@pytest.mark.parametrize("groups", [[6], [1, 5], [2, 1, 3], [1] * 6])
@pytest.mark.parametrize("M,output_norm", [(None, None), (None, "shared"),
                                           (3, "per_query"), (2, "shared")])
def test_partials_merge_into_the_whole(groups, M, output_norm):
    sources, query, g, h = _problem(M=M, output_norm=output_norm)
    whole = attnres_reference(sources, query, key_norm_weight=g,
                              output_norm_weight=h, eps=1e-5, scale=0.8)
    partials, lses = [], []
    for group in torch.split(sources, groups):
        o, lse = attnres_partial_reference(group, query, key_norm_weight=g,
                                           eps=1e-5, scale=0.8)
        assert o.dtype == F64 and lse.shape == o.shape[:-1]
        partials.append(o)
        lses.append(lse)
    merged, _ = partition_reduce_reference(
        torch.stack(partials), torch.stack(lses), output_norm_weight=h,
        eps=1e-5)
    torch.testing.assert_close(merged, whole, rtol=1e-12, atol=1e-12)
    grad = torch.randn(whole.shape, generator=torch.Generator().manual_seed(9),
                       dtype=F64)
    leaves = _leaves(sources, query, g, h)
    want = torch.autograd.grad(whole, leaves, grad)
    got = torch.autograd.grad(merged, leaves, grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_merged_lse_is_the_whole_lse():
    sources, query, g, _ = _problem(M=2, output_norm=None)
    _, whole = attnres_reference(sources, query, key_norm_weight=g,
                                 return_lse=True)
    parts = [attnres_partial_reference(s, query, key_norm_weight=g)
             for s in torch.split(sources, [4, 2])]
    _, lse = partition_reduce_reference(torch.stack([p[0] for p in parts]),
                                        torch.stack([p[1] for p in parts]))
    torch.testing.assert_close(lse, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("M", [None, 3])
def test_lse_gradient_in_the_backward_formulas(M):
    # The backward of a partial, given the gradients of o and of lse, by the
    # formulas (ds_s = scale p_s (<do, v_s> - delta + dlse)) against
    # autograd of <o, do> + <lse, dlse>.
    sources, query, g, _ = _problem(L=5, M=M, output_norm=None)
    o, lse = attnres_partial_reference(sources, query, key_norm_weight=g,
                                       eps=1e-5, scale=1.3)
    gen = torch.Generator().manual_seed(4)
    do = torch.randn(o.shape, generator=gen, dtype=F64)
    dlse = torch.randn(lse.shape, generator=gen, dtype=F64)
    want = torch.autograd.grad((o * do).sum() + (lse * dlse).sum(),
                               [sources, query, g])
    dv, dq, dg, _ = attnres_backward_reference(
        sources.detach(), query.detach(), do, key_norm_weight=g.detach(),
        eps=1e-5, scale=1.3, grad_lse=dlse)
    for a, b in zip((dv, dq, dg), want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # Without dlse the formulas give a different (wrong) answer.
    dv0, _, _, _ = attnres_backward_reference(
        sources.detach(), query.detach(), do, key_norm_weight=g.detach(),
        eps=1e-5, scale=1.3)
    assert (dv0 - want[0]).abs().max() > 1e-3


# --- two gloo processes ------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SPLIT = [2, 3]  # sources of rank 0 and rank 1


def _rank_main(rank, world, port, folder, M, output_norm):
    import torch.distributed as dist

    from attnres.distributed import sharded_attnres
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    try:
        sources, query, g, h = _problem(L=sum(SPLIT), M=M,
                                        output_norm=output_norm)
        mine = torch.split(sources.detach(), SPLIT)[rank].clone()
        mine.requires_grad_()
        query, g = query.detach().requires_grad_(), g.detach().requires_grad_()
        h = h.detach().requires_grad_() if h is not None else None
        o = sharded_attnres(mine, query, key_norm_weight=g,
                            output_norm_weight=h, eps=1e-5, scale=0.8)
        # Each rank's own loss; the gradients are those of their sum.
        grad = torch.randn(o.shape, dtype=F64,
                           generator=torch.Generator().manual_seed(100 + rank))
        (o * grad).sum().backward()
        torch.save({"o": o.detach(), "grad": grad, "dv": mine.grad,
                    "dq": query.grad, "dg": g.grad,
                    "dh": h.grad if h is not None else None},
                   os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.distributed.is_available() or
                    not torch.distributed.is_gloo_available(),
                    reason="needs torch.distributed with gloo")
@pytest.mark.parametrize("M,output_norm", [(None, "shared"),
                                           (2, "per_query")])
def test_sharded_attnres_over_two_gloo_ranks(tmp_path, M, output_norm):
    import torch.multiprocessing as mp
    world = len(SPLIT)
    mp.spawn(_rank_main, args=(world, _free_port(), str(tmp_path), M,
                               output_norm), nprocs=world)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    sources, query, g, h = _problem(L=sum(SPLIT), M=M,
                                    output_norm=output_norm)
    whole = attnres_reference(sources, query, key_norm_weight=g,
                              output_norm_weight=h, eps=1e-5, scale=0.8)
    for result in results:
        torch.testing.assert_close(result["o"], whole, rtol=1e-12,
                                   atol=1e-12)
    grad = sum(result["grad"] for result in results)
    want = torch.autograd.grad(whole, _leaves(sources, query, g, h), grad)
    dv = torch.cat([result["dv"] for result in results])
    torch.testing.assert_close(dv, want[0], rtol=1e-10, atol=1e-12)
    # Parameter gradients: each rank's share, summed over the group.
    for index, name in enumerate(["dq", "dg", "dh"][:len(want) - 1], 1):
        total = sum(result[name] for result in results)
        torch.testing.assert_close(total, want[index], rtol=1e-10,
                                   atol=1e-12)


def test_link_bytes_formula():
    from attnres.distributed import link_bytes
    partials, sources = link_bytes(8192, 4096, world_size=2,
                                   local_sources=16)
    # Two ranks: the partial row and lse out, the output gradient's half
    # out and in (a ring all-reduce of two); the sources out, their
    # gradients' other half in.
    assert partials == 8192 * 4097 * 4 + 8192 * 4096 * 4
    assert sources == 2 * 16 * 8192 * 4096 * 2
    partials, sources = link_bytes(100, 64, 3, world_size=4,
                                   local_sources=5, source_bytes=4)
    assert partials == 3 * 300 * 65 * 4 + 2 * 3 * 300 * 64 * 4 // 4
    assert sources == 2 * 3 * 5 * 100 * 64 * 4


def _mismatch_main(rank, world, port, folder):
    import torch.distributed as dist

    from attnres import InvalidArgumentError
    from attnres.distributed import sharded_attnres
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    try:
        # Rank 1 holds sources of 5 tokens, rank 0 of 4.
        sources = torch.randn(2, 4 + rank, 8, dtype=F64)
        try:
            sharded_attnres(sources, torch.randn(8, dtype=F64))
            message = "no error"
        except InvalidArgumentError as error:
            message = str(error)
        with open(os.path.join(folder, f"rank{rank}.txt"), "w") as out:
            out.write(message)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.distributed.is_available() or
                    not torch.distributed.is_gloo_available(),
                    reason="needs torch.distributed with gloo")
def test_sharded_attnres_refuses_ranks_that_disagree(tmp_path):
    import torch.multiprocessing as mp
    mp.spawn(_mismatch_main, args=(2, _free_port(), str(tmp_path)), nprocs=2)
    for rank in range(2):
        message = (tmp_path / f"rank{rank}.txt").read_text()
        assert "[M, N, D] differ (rank 0: [1, 4, 8], rank 1: [1, 5, 8])" \
            in message


def test_sharded_attnres_needs_a_process_group():
    from attnres import InvalidArgumentError
    from attnres.distributed import sharded_attnres
    if torch.distributed.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(InvalidArgumentError, match="needs an initialized "
                       "torch.distributed process group"):
        sharded_attnres(torch.randn(2, 4, 8), torch.randn(8))
