"""AttnRes over sources held by different ranks of a ``torch.distributed``
process group (pipeline-parallel stages that each keep some of a layer's
earlier outputs).

Each rank reduces its own sources to one partial result, the FP32 output
before the output norm and its log-sum-exp (:func:`attnres.attnres_partial`);
the partials are all-gathered and merged by the softmax partition reduce
(:func:`attnres.partition_reduce`, docs/Math.md section 3), which gives
exactly AttnRes over all sources. What crosses the link per token and query
is ``(D + 1)`` FP32 values from each rank, however many sources it holds,
against ``L_r * D`` source values (``2 L_r D`` bytes in bf16) to gather the
sources themselves. docs/Distributed.md has the byte counts and timings.

The backward goes through the differentiable all-gather of
``torch.distributed.nn``: every rank receives the gradient of its own
partial, summed over the ranks' losses, and back-propagates it into its own
sources. The result is the gradient of the **sum** of the ranks' losses:
source gradients land on the rank holding the source; the query and weight
gradients of each rank are its share, to be summed over the group (a
``DistributedDataParallel`` or an ``all_reduce`` of the parameters' ``grad``
does it).

On CUDA tensors the partials and the merge are the compiled kernels; on CPU
tensors the plain-PyTorch reference (:mod:`attnres.reference`) computes
them, so that the communication can be tested without a GPU.
"""

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_functional

from . import _checks
from .errors import InvalidArgumentError
from .reference import attnres_partial_reference, partition_reduce_reference


def _partial(sources, query, key_norm_weight, eps, scale):
    if query.is_cuda:
        from .api import attnres_partial
        return attnres_partial(sources, query, key_norm_weight=key_norm_weight,
                               eps=eps, scale=scale)
    return attnres_partial_reference(sources, query,
                                     key_norm_weight=key_norm_weight,
                                     eps=eps, scale=scale)


def _merge(partials, lse, output_norm_weight, eps):
    # The kernel's weight is [D]; a per-query [M, D] weight is applied to the
    # merged rows here.
    kernel_norm = output_norm_weight is not None and \
        output_norm_weight.dim() == 1
    if partials.is_cuda:
        from .api import partition_reduce
        o, _ = partition_reduce(partials, lse, output_norm_weight=(
            output_norm_weight if kernel_norm else None), eps=eps)
    else:
        o, _ = partition_reduce_reference(partials, lse, output_norm_weight=(
            output_norm_weight if kernel_norm else None), eps=eps)
    if output_norm_weight is not None and not kernel_norm:
        h = output_norm_weight.to(o.dtype)
        h = h.reshape((h.shape[0],) + (1,) * (o.dim() - 2) + (h.shape[1],))
        o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + eps) * h
    return o


def sharded_attnres(local_sources, query, *, key_norm_weight=None,
                    output_norm_weight=None, eps=1e-6, scale=1.0, group=None):
    """AttnRes over the sources of every rank of `group` (default: the
    world), the same on every rank.

    local_sources: this rank's sources, a list of tensors ``[..., D]`` or
        one packed ``[L_r, ..., D]`` tensor (as for :func:`attnres.attnres`);
        the token shape ``...`` and D must agree across ranks, the source
        counts need not. The order of the sources over the group is rank
        order; the result does not depend on it.
    query, key_norm_weight, output_norm_weight, eps, scale: as for
        :func:`attnres.attnres`, the same on every rank.

    Returns ``[..., D]`` (``[M, ..., D]`` for a 2-D query) in the sources'
    dtype. Differentiable: see the module's docstring for which gradient
    lands where.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError(
            "sharded_attnres needs an initialized torch.distributed process "
            "group (torch.distributed.init_process_group)")
    first = local_sources if isinstance(local_sources, torch.Tensor) else \
        (local_sources[0] if isinstance(local_sources, (list, tuple)) and
         local_sources else None)
    if first is None:
        raise InvalidArgumentError(
            "sharded_attnres needs at least one local source on every rank")
    if output_norm_weight is not None and query.is_cuda:
        # The weight's checks (shape, dtype) are attnres's, made here since
        # the partials do not see it.
        _checks.check_attnres(local_sources, query, key_norm_weight,
                              output_norm_weight, eps, scale, "o_pre")
    o, lse = _partial(local_sources, query, key_norm_weight, eps, scale)
    # One collective for both: [..., D + 1] FP32 rows.
    row = torch.cat([o, lse.unsqueeze(-1)], dim=-1).contiguous()
    gathered = torch.stack(dist_functional.all_gather(row, group=group))
    D = o.shape[-1]
    merged = _merge(gathered[..., :D], gathered[..., D], output_norm_weight,
                    eps)
    return merged.to(first.dtype)


def link_bytes(num_tokens, width, num_queries=1, *, world_size,
               local_sources, source_bytes=2):
    """What one rank sends for one call, by the two plans: ``(partials,
    sources)`` in bytes. The partials: its ``M * N * (D + 1)`` FP32 values to
    each of the other ``world_size - 1`` ranks in the forward, the same
    again (their gradients) in the backward. Gathering the sources instead:
    its ``L_r * N * D`` source values to each other rank in the forward and
    their gradients back in the backward."""
    others = world_size - 1
    partials = 2 * others * num_queries * num_tokens * (width + 1) * 4
    sources = 2 * others * local_sources * num_tokens * width * source_bytes
    return partials, sources
