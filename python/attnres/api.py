"""The user-facing PyTorch functions. Arguments are checked before the
custom ops (and PyTorch >= 2.4) are needed, so a wrong call gets its message
whatever the installation."""

import importlib.util

from . import _checks


def _torch():
    import torch
    return torch


def _ops():
    from . import ops
    return ops


_eager = []
# Without PyTorch the checks below say what is wrong with a call. (Decided
# once, here: torch.compile traces attnres(), which should hold no try.)
_HAS_TORCH = importlib.util.find_spec("torch") is not None


def _eager_path():
    """ops.attnres_eager, or None where the PyTorch ops cannot load (then
    the full path's checks and import give the message)."""
    if not _eager:
        try:
            from .ops import attnres_eager
        except ImportError:
            attnres_eager = None
        _eager.append(attnres_eager)
    return _eager[0]


def _cuda_available():
    if not _HAS_TORCH:
        return False
    torch = _torch()
    return bool(torch.cuda.is_available())


def _kernel_layout(call, sources, query):
    """The custom ops' operands: sources [N, D] each (or one [L, N, D]) and
    an [M, R] query."""
    N, D = call.N, call.D
    if call.packed:
        flat = [sources.reshape(call.L, N, D)]
    else:
        flat = [s.reshape(N, D) for s in sources]
    return flat, query if call.multi_query else query.unsqueeze(0)


def _per_token(call, result, *inner):
    """A custom op's [M, N, ...] result in the caller's token shape: [M?,
    T..., ...]."""
    result = result.reshape((call.M,) + call.lead + inner)
    return result if call.multi_query else result.squeeze(0)


def attnres(sources, query, *, key_norm_weight=None, output_norm_weight=None,
            eps=1e-6, scale=1.0, save="o_pre"):
    """Attention Residuals: per token, a softmax over the sources.

    sources: a list of L tensors ``[..., D]`` (one shape, one dtype: bf16,
        f16 or f32) or one packed ``[L, ..., D]`` tensor.
    query: ``[R]``, or ``[M, R]`` for M queries (1 <= M <= 16) reading the
        sources once; the sources' dtype or float32.
    key_norm_weight: ``[R]``, the RMSNorm weight of the keys (the last R
        coordinates of each source).
    output_norm_weight: ``[D]`` or ``[M, D]``: applies an RMSNorm with this
        weight to the output (the fused pre-norm of the next layer).
    save: ``"o_pre"`` keeps the output before its norm for the backward
        (each source read once), ``"lse"`` keeps only the log-sum-exp (less
        memory, the backward recomputes).

    Returns ``[..., D]``, or ``[M, ..., D]`` for a 2-D query, in the
    sources' dtype. Differentiable in sources, query and both weights.
    """
    # Traced calls (torch.compile, export) take the custom op below; the
    # import of the eager path is left out of their graphs.
    compiler = getattr(_torch(), "compiler", None) if _HAS_TORCH else None
    eager = None if compiler is None or compiler.is_compiling() else \
        _eager_path()
    if eager is not None:
        o = eager(sources, query, key_norm_weight, output_norm_weight, eps,
                  scale, save)
        if o is not None:
            return o
    call = _checks.check_attnres(sources, query, key_norm_weight,
                                 output_norm_weight, eps, scale, save,
                                 cuda_available=_cuda_available())
    flat, q = _kernel_layout(call, sources, query)
    o = _ops().forward_op(flat, q, key_norm_weight, output_norm_weight,
                          float(eps), float(scale), save)[0]
    return _per_token(call, o, call.D)


def attnres_partial(sources, query, *, key_norm_weight=None, eps=1e-6,
                    scale=1.0):
    """The partial result of AttnRes over one group of sources: ``(o,
    lse)``, ``o`` the float32 output before any output norm (``[..., D]``,
    or ``[M, ..., D]`` for a 2-D query) and ``lse`` its log-sum-exp
    (``[...]`` or ``[M, ...]``).

    The partials of several groups merge into AttnRes over all of their
    sources: ``partition_reduce(torch.stack(os), torch.stack(lses),
    output_norm_weight=h)`` equals ``attnres(all sources, query,
    output_norm_weight=h)``, values and gradients (docs/Math.md section 3).
    Arguments as for :func:`attnres`; differentiable in the sources, the
    query and the key-norm weight, through both results.
    """
    call = _checks.check_attnres(sources, query, key_norm_weight, None, eps,
                                 scale, "o_pre",
                                 cuda_available=_cuda_available())
    flat, q = _kernel_layout(call, sources, query)
    o, lse = _ops().partial_op(flat, q, key_norm_weight, float(eps),
                               float(scale))
    return _per_token(call, o, call.D), _per_token(call, lse)


def partition_reduce(partials, lse=None, *, sink=None,
                     output_norm_weight=None, eps=1e-6, mode="softmax"):
    """Merges P partial results (docs/Math.md section 3).

    ``mode="softmax"``: partials ``[P, ..., D]`` and their ``lse`` ``[P,
    ...]`` (float32), optional ``sink`` logits ``[...]``; returns the merged
    ``(o [..., D], lse [...])``. Partitions with ``lse = -inf`` are empty and
    ignored whatever their rows hold. With ``output_norm_weight`` ``[D]`` the
    merged rows are RMS-normalized with it and returned in its dtype.

    ``mode="sum"``: partials ``[P, ...]`` summed in FP32 in a fixed order.
    """
    call = _checks.check_partition_reduce(
        partials, lse, sink, output_norm_weight, eps, mode,
        cuda_available=_cuda_available())
    ops = _ops()
    if mode == "sum":
        count = 1
        for extent in call.shape:
            count *= extent
        flat = partials.reshape(call.P, count)
        return ops.sum_op(flat).reshape(call.shape)
    o, merged = ops.merge_op(
        partials.reshape(call.P, call.rows, call.D),
        lse.reshape(call.P, call.rows),
        None if sink is None else sink.reshape(call.rows),
        output_norm_weight, float(eps))
    return o.reshape(call.lead + (call.D,)), merged.reshape(call.lead)
