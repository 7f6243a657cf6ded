"""AttnRes in plain PyTorch (docs/Math.md section 1), differentiable by
autograd: the model the compiled op is compared with, and a fallback for
devices the compiler does not target.

Same interface as :func:`attnres.attnres`; accumulates in float32 (or
float64 for float64 inputs) and returns the sources' dtype.
"""

import torch


def rms_norm(rows, weight, eps):
    """rows ``[..., D]`` RMS-normalized and scaled by weight ``[D]`` (or
    ``[M, D]`` for rows ``[M, ..., D]``, one weight row per query), in the
    rows' dtype: the output norm of docs/Math.md section 1."""
    h = weight.to(rows.dtype)
    if h.dim() == 2:
        h = h.reshape((h.shape[0],) + (1,) * (rows.dim() - 2) +
                      (h.shape[1],))
    return rows * torch.rsqrt(rows.square().mean(-1, keepdim=True) + eps) * h


def attnres_reference(sources, query, *, key_norm_weight=None,
                      output_norm_weight=None, eps=1e-6, scale=1.0,
                      save="o_pre", return_lse=False):
    del save  # what to keep for the backward is autograd's business here
    v = sources if isinstance(sources, torch.Tensor) else torch.stack(
        list(sources))
    dtype = v.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    v = v.to(compute)                                  # [L, ..., D]
    q = query.to(compute)
    multi = q.dim() == 2
    if not multi:
        q = q.unsqueeze(0)                             # [M, R]
    D, R = v.shape[-1], q.shape[-1]
    t = v[..., D - R:]
    rho = torch.rsqrt(t.square().mean(-1, keepdim=True) + eps)
    k = rho * t                                        # [L, ..., R]
    if key_norm_weight is not None:
        k = k * key_norm_weight.to(compute)
    logits = scale * torch.einsum("l...r,mr->ml...", k, q)   # [M, L, ...]
    lse = torch.logsumexp(logits, dim=1)                      # [M, ...]
    p = torch.exp(logits - lse.unsqueeze(1))
    o = torch.einsum("ml...,l...d->m...d", p, v)              # [M, ..., D]
    if output_norm_weight is not None:
        o = rms_norm(o, output_norm_weight, eps)
    o = o.to(dtype)
    if not multi:
        o, lse = o.squeeze(0), lse.squeeze(0)
    return (o, lse) if return_lse else o


def attnres_partial_reference(sources, query, *, key_norm_weight=None,
                              eps=1e-6, scale=1.0):
    """The partial result of :func:`attnres.attnres_partial`: ``(o, lse)``,
    o before any output norm, both in float32 (float64 for float64
    inputs)."""
    v = sources if isinstance(sources, torch.Tensor) else torch.stack(
        list(sources))
    compute = torch.float64 if v.dtype == torch.float64 else torch.float32
    o, lse = attnres_reference(v.to(compute), query.to(compute),
                               key_norm_weight=None if key_norm_weight is None
                               else key_norm_weight.to(compute),
                               eps=eps, scale=scale, return_lse=True)
    return o, lse


def partition_reduce_reference(partials, lse, *, output_norm_weight=None,
                               eps=1e-6):
    """The softmax merge of docs/Math.md section 3 (no sink), differentiable
    by autograd: partials ``[P, ..., D]`` and ``lse`` ``[P, ...]`` give
    ``(o, lse)``. An ``output_norm_weight`` of ``[D]``, or ``[M, D]`` for
    partials ``[P, M, ..., D]``, RMS-normalizes the merged rows."""
    empty = torch.isneginf(lse)
    top = lse.max(dim=0).values
    shift = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
    weights = torch.where(empty, torch.zeros_like(lse),
                          torch.exp(lse - shift))
    total = weights.sum(0)
    values = torch.where(empty.unsqueeze(-1), torch.zeros_like(partials),
                         partials)
    merged = (weights.unsqueeze(-1) * values).sum(0) / \
        torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(-1)
    merged_lse = shift + torch.log(total)
    if output_norm_weight is not None:
        merged = rms_norm(merged, output_norm_weight, eps)
    return merged, merged_lse


def attnres_backward_reference(sources, query, grad, *, key_norm_weight=None,
                               output_norm_weight=None, eps=1e-6, scale=1.0,
                               grad_lse=None, lse=None, o_pre=None):
    """The gradients by the formulas of docs/Math.md section 2 (not autograd):
    returns (d sources [L, ..., D], dq, dg or None, dh or None) for the
    output gradient `grad` ([..., D], or [M, ..., D] for a 2-D query) and,
    when given, the gradient `grad_lse` of the forward's lse ([...] or
    [M, ...]). `lse` and `o_pre` are the forward's saved results, as the
    backward kernel reads them (by default computed from these sources):
    given those of a forward over more sources, the result is the gradient
    of that forward with respect to these sources. (The kernels agree with
    this for two sources or more; a one-source kernel takes the weight as
    exactly 1, the lse of that source's own forward.)"""
    v = sources if isinstance(sources, torch.Tensor) else torch.stack(
        list(sources))
    compute = torch.float64 if v.dtype == torch.float64 else torch.float32
    L, D = v.shape[0], v.shape[-1]
    v = v.to(compute).reshape(L, -1, D)                    # [L, N, D]
    multi = query.dim() == 2
    q = query.to(compute).reshape(-1, query.shape[-1])     # [M, R]
    M, R = q.shape
    do = grad.to(compute).reshape(M, -1, D)                # [M, N, D]
    g = key_norm_weight.to(compute) if key_norm_weight is not None else None
    a = q * g if g is not None else q
    t = v[..., D - R:]
    rho = torch.rsqrt(t.square().mean(-1) + eps)           # [L, N]
    khat = rho[..., None] * t
    ell = torch.einsum("lnr,mr->mln", khat, a)             # [M, L, N]
    if lse is None or L == 1:
        # One source's weight is 1 whatever the lse given (an lse rounded
        # to f32 differs from the logit).
        p = torch.softmax(scale * ell, dim=1)
    else:
        p = torch.exp(scale * ell - lse.to(compute).reshape(M, 1, -1))
    if o_pre is None:
        o_pre = torch.einsum("mln,lnd->mnd", p, v)
    else:
        o_pre = o_pre.to(compute).reshape(M, -1, D)
    dh = None
    if output_norm_weight is not None:
        h = output_norm_weight.to(compute)
        hw = h if h.dim() == 1 else h[:, None, :]
        rho_o = torch.rsqrt(o_pre.square().mean(-1, keepdim=True) + eps)
        xhat = o_pre * rho_o
        do_pre = rho_o * (hw * do - xhat * (xhat * hw * do).mean(-1, True))
        dh = (xhat * do).sum(dim=(0, 1) if h.dim() == 1 else 1)
    else:
        do_pre = do
    delta = (do_pre * o_pre).sum(-1)                       # [M, N]
    if grad_lse is not None:                  # d lse / d z_s = p_s
        delta = delta - grad_lse.to(compute).reshape(M, -1)
    ds = scale * p * (torch.einsum("mnd,lnd->mln", do_pre, v) -
                      delta[:, None])
    dv = torch.einsum("mln,mnd->lnd", p, do_pre)
    dv[..., D - R:] += (ds[..., None] * rho[None, ..., None] *
                        (a[:, None, None, :] -
                         khat[None] * ell[..., None] / R)).sum(0)
    da = torch.einsum("mln,lnr->mr", ds, khat)
    dq = da * g if g is not None else da
    dg = (da * q).sum(0) if g is not None else None
    shape = sources.shape if isinstance(sources, torch.Tensor) else \
        (L,) + tuple(sources[0].shape)
    dq = dq if multi else dq[0]
    return dv.reshape(shape), dq, dg, dh


# --- the residual of a 16-bit o_pre (docs/Math.md, "save and accuracy") ----

_EXPONENT = 0x7F800000


def _fraction_bits(dtype):
    return 7 if dtype == torch.bfloat16 else 10


def _power_of_two(rounded):
    """2^e of the float32 values `rounded` (= 1.f * 2^e), and where they are
    normal (the residual is 0 elsewhere)."""
    field = rounded.view(torch.int32) & _EXPONENT
    return field.view(torch.float32), (field != 0) & (field != _EXPONENT)


def o_pre_residual(exact, dtype):
    """The residual of float32 `exact` ([..., D], D even) rounded to the
    16-bit `dtype`: int8 [..., D/2], element 2j in the low and 2j + 1 in the
    high four bits, each n in [-7, 7] with exact ~ x + n * ulp(x) / 14."""
    exact = exact.float()
    rounded = exact.to(dtype).float()
    power, normal = _power_of_two(rounded)
    normal &= rounded.abs() < 2.0 ** 127
    steps = (exact - rounded) / power * (14.0 * 2 ** _fraction_bits(dtype))
    steps = torch.where(normal, steps, torch.zeros_like(steps))
    n = torch.round(steps.clamp(-7.0, 7.0)).to(torch.int16)  # ties to even
    packed = (n[..., 0::2] & 0xF) | ((n[..., 1::2] & 0xF) << 4)
    return torch.where(packed > 127, packed - 256, packed).to(torch.int8)


def residual_steps(residual):
    """The signed residuals n ([..., D] int16, each in [-8, 7]) packed in
    `residual` ([..., D/2] int8): element 2j from the low four bits."""
    wide = residual.to(torch.int16)
    low = ((wide & 0xF) ^ 8) - 8
    high = wide >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)


def decode_o_pre(rounded, residual):
    """The float32 o_pre that 16-bit `rounded` ([..., D]) and its residual
    ([..., D/2] int8) stand for."""
    step = torch.tensor(1.0 / (14.0 * 2 ** _fraction_bits(rounded.dtype)),
                        dtype=torch.float32)
    x = rounded.float()
    n = residual_steps(residual).float()
    power, normal = _power_of_two(x)
    return torch.where(normal, x + n * (power * step.to(x.device)), x)
