"""AttnRes over sources held by different ranks of a ``torch.distributed``
process group (pipeline-parallel stages that each keep some of a layer's
earlier outputs).

**Forward.** Each rank reduces its own sources to one partial result, the
FP32 output before the output norm and its log-sum-exp (the kernels of
:func:`attnres.attnres_partial`); the partials are all-gathered and merged by
the softmax partition reduce (docs/Math.md section 3), which gives exactly
AttnRes over all sources; the output norm is applied to the merged rows.
Every rank gets the whole output.

**Backward.** The gradient of the output is summed over the ranks (one
``all_reduce``: each rank's loss may use the output differently), and each
rank runs the ordinary backward kernel over its own sources with the merged
lse and o_pre: since ``p_s = exp(z_s - lse)`` with the merged lse is the
whole softmax's weight of source s, that gives the whole op's gradient with
respect to the rank's sources, reading each of them once. No partial's
gradient is formed.

**What crosses the link**, per token and query: ``D + 1`` FP32 values from
each rank in the forward (its partial row and lse) and ``D`` FP32 values in
the backward's all-reduce, however many sources a rank holds; gathering the
sources instead moves ``L_r * D`` values of the sources' type each way.
:func:`link_bytes` gives the counts; docs/Distributed.md the measurements.

**Gradients.** The result is the gradient of the **sum** of the ranks'
losses. Source gradients land on the rank holding the source. The query and
key-norm gradients of a rank are its sources' share; the output-norm
gradient is split evenly (each rank returns ``1 / world`` of it): summed
over the group (``all_reduce`` of the parameters' ``grad``) they are the
gradient of the summed loss.

On CUDA tensors the kernels compute; on CPU tensors the plain-PyTorch
reference (:mod:`attnres.reference`) computes the same steps, so that the
communication can be tested without a GPU.
"""

import os

import torch
import torch.distributed as dist

from . import _checks
from .errors import InvalidArgumentError
from .reference import (attnres_backward_reference,
                        attnres_partial_reference, partition_reduce_reference,
                        rms_norm)


def _stacked(sources):
    """The reference's [L, N, D] of the Function's sources (one packed
    tensor or L rows)."""
    return sources[0] if sources[0].dim() == 3 else torch.stack(sources)


def merge_rows(partials, partial_lse, output_norm, eps):
    """The gathered partials [W, rows, D] and lse [W, rows] merged: (out,
    o_pre, lse), out normalized by output_norm ([D], or [M, D] for rows of
    M queries) when given, o_pre FP32 on the GPU."""
    rows, D = partials.shape[1:]
    if not partials.is_cuda:
        o_pre, lse = partition_reduce_reference(partials, partial_lse)
    elif output_norm is not None and output_norm.dim() == 1:
        # The merge kernel applies the norm and keeps the FP32 o_pre.
        from . import ops
        out, lse, o_pre = ops.merge_normalized_impl(partials, partial_lse,
                                                    output_norm, eps)
        return out, o_pre, lse
    else:
        from . import ops
        o_pre, lse = ops.merge_op(partials, partial_lse, None, None,
                                  float(eps))
    if output_norm is None:
        return o_pre, o_pre, lse
    M = output_norm.shape[0] if output_norm.dim() == 2 else 1
    out = rms_norm(o_pre.reshape(M, rows // M, D), output_norm, eps)
    return out.reshape(rows, D), o_pre, lse


def _check_same_rows(shape, device, group, world):
    """Every rank's partial must have the same [M, N, D]: the all-gather
    below would otherwise fail or hang without saying why. Each rank sees
    every rank's shape, so all of them raise."""
    mine = torch.tensor(list(shape), dtype=torch.int64, device=device)
    shapes = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(shapes, mine, group=group)
    shapes = [s.tolist() for s in shapes]
    if any(s != shapes[0] for s in shapes):
        each = ", ".join(f"rank {r}: {s}" for r, s in enumerate(shapes))
        raise InvalidArgumentError(
            f"sharded_attnres: the ranks' queries, tokens and widths "
            f"[M, N, D] differ ({each}); every rank must pass sources of one "
            f"token shape and width and the same query")


class _Sharded(torch.autograd.Function):
    """Inside: sources [L_r, N, D] packed or L_r tensors [N, D], query
    [M, R]; o_pre and lse [M, N, D] and [M, N]."""

    @staticmethod
    def forward(ctx, query, key_norm, output_norm, eps, scale, group,
                *sources):
        cuda = query.is_cuda
        if cuda:
            from . import ops
            o, lse = ops.partial_impl(list(sources), query, key_norm, eps,
                                      scale)
        else:
            o, lse = attnres_partial_reference(_stacked(sources), query,
                                               key_norm_weight=key_norm,
                                               eps=eps, scale=scale)
        M, N, D = o.shape
        world = dist.get_world_size(group)
        _check_same_rows(o.shape, query.device, group, world)
        # One collective for both: [M, N, D + 1] rows.
        row = torch.cat([o, lse.unsqueeze(-1)], dim=-1).contiguous()
        gathered = [torch.empty_like(row) for _ in range(world)]
        dist.all_gather(gathered, row, group=group)
        gathered = torch.stack(gathered)
        partials = gathered[..., :D].reshape(world, M * N, D).contiguous()
        partial_lse = gathered[..., D].reshape(world, M * N).contiguous()
        out, o_pre, merged_lse = merge_rows(partials, partial_lse,
                                            output_norm, eps)
        out, o_pre = out.reshape(M, N, D), o_pre.reshape(M, N, D)
        merged_lse = merged_lse.reshape(M, N)
        ctx.constants = (eps, scale, group, world)
        ctx.has = (key_norm is not None, output_norm is not None)
        ctx.save_for_backward(query, *(t for t in (key_norm, output_norm)
                                       if t is not None),
                              o_pre, merged_lse, *sources)
        return out.to(sources[0].dtype)

    @staticmethod
    def backward(ctx, grad):
        eps, scale, group, world = ctx.constants
        tensors = list(ctx.saved_tensors)
        query = tensors.pop(0)
        key_norm = tensors.pop(0) if ctx.has[0] else None
        output_norm = tensors.pop(0) if ctx.has[1] else None
        o_pre, lse = tensors[:2]
        sources = tensors[2:]
        # The gradient of the sum of the ranks' losses, in o_pre's type (FP32
        # on the GPU).
        total = grad.to(o_pre.dtype).contiguous()
        dist.all_reduce(total, group=group)
        if query.is_cuda:
            from . import ops
            grad_sources, dq, dg, dh = ops.backward_impl(
                sources, query, key_norm, output_norm, total, lse, o_pre,
                None, eps, scale, "o_pre", fp32_output=True)
            per_source, dq, dg, dh = ops._gradients(
                sources, key_norm, output_norm, (grad_sources, dq, dg, dh))
        else:
            stacked = _stacked(sources)
            dv, dq, dg, dh = attnres_backward_reference(
                stacked, query, total, key_norm_weight=key_norm,
                output_norm_weight=output_norm, eps=eps, scale=scale,
                lse=lse, o_pre=o_pre)
            dv = dv.to(stacked.dtype)
            per_source = (dv,) if sources[0].dim() == 3 else dv.unbind(0)
            dq = dq.to(query.dtype)
            dg = dg.to(key_norm.dtype) if dg is not None else None
            dh = dh.to(output_norm.dtype) if dh is not None else None
        if dh is not None:
            # Every rank forms the whole output-norm gradient from the summed
            # output gradient: each returns its even share.
            dh = dh / world
        return (dq, dg, dh, None, None, None, *per_source)


def sharded_attnres(local_sources, query, *, key_norm_weight=None,
                    output_norm_weight=None, eps=1e-6, scale=1.0, group=None):
    """AttnRes over the sources of every rank of `group` (default: the
    world), the same on every rank.

    local_sources: this rank's sources, a list of tensors ``[..., D]`` or
        one packed ``[L_r, ..., D]`` tensor (as for :func:`attnres.attnres`);
        the token shape ``...`` and D must agree across ranks, the source
        counts need not. The result does not depend on how the sources are
        spread over the ranks.
    query, key_norm_weight, output_norm_weight, eps, scale: as for
        :func:`attnres.attnres`, the same on every rank.

    Returns ``[..., D]`` (``[M, ..., D]`` for a 2-D query) in the sources'
    dtype. Differentiable in the local sources, the query and both weights:
    see the module's docstring for which gradient lands where.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError(
            "sharded_attnres needs an initialized torch.distributed process "
            "group (torch.distributed.init_process_group)")
    if isinstance(local_sources, (list, tuple)) and not local_sources:
        raise InvalidArgumentError(
            "sharded_attnres needs at least one local source on every rank")
    if query.is_cuda:
        call = _checks.check_attnres(local_sources, query, key_norm_weight,
                                     output_norm_weight, eps, scale, "o_pre")
        lead, D, M, multi = call.lead, call.D, call.M, call.multi_query
        N, packed = call.N, call.packed
    else:
        first = local_sources if isinstance(local_sources, torch.Tensor) \
            else local_sources[0]
        packed = isinstance(local_sources, torch.Tensor)
        lead = tuple(first.shape[1:-1] if packed else first.shape[:-1])
        D, multi = first.shape[-1], query.dim() == 2
        M = query.shape[0] if multi else 1
        N = 1
        for extent in lead:
            N *= extent
    if packed:
        flat = (local_sources.reshape(local_sources.shape[0], N, D),)
    else:
        flat = tuple(s.reshape(N, D) for s in local_sources)
    q = query if multi else query.unsqueeze(0)
    out = _Sharded.apply(q, key_norm_weight, output_norm_weight, float(eps),
                         float(scale), group, *flat)
    out = out.reshape((M,) + tuple(lead) + (D,))
    return out if multi else out.squeeze(0)


def link_bytes(num_tokens, width, num_queries=1, *, world_size,
               local_sources, source_bytes=2):
    """What one rank sends for one forward and backward, by the two plans:
    ``(partials, sources)`` in bytes, counting a ring all-gather, all-reduce
    and reduce-scatter (what NCCL does on one node).

    * partials: its ``M N (D + 1)`` FP32 values to each of the other
      ``world_size - 1`` ranks (all-gather), then ``2 (W - 1) / W`` of the
      ``M N D`` FP32 output gradient (all-reduce);
    * sources: its ``L_r N D`` source values to each other rank
      (all-gather), then ``(W - 1) / W`` of the ``L N D`` source gradients
      (reduce-scatter: ``(W - 1) L_r N D``)."""
    W = world_size
    rows = num_queries * num_tokens
    partials = (W - 1) * rows * (width + 1) * 4 + \
        2 * (W - 1) * rows * width * 4 // W
    sources = 2 * (W - 1) * local_sources * num_tokens * width * source_bytes
    return partials, sources


def init_torchrun(backend="auto"):
    """Initializes the default process group of a ``torchrun`` launch and
    selects this rank's GPU (``LOCAL_RANK``, modulo the GPUs there are).
    ``backend="auto"`` takes NCCL where every rank has a GPU of its own and
    gloo where ranks share one (NCCL refuses two ranks on one GPU). Returns
    ``(rank, world_size, device)``."""
    if backend == "auto":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    return rank, dist.get_world_size(), torch.device(
        "cuda", torch.cuda.current_device())
