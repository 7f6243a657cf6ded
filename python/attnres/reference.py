"""AttnRes in plain PyTorch (docs/Math.md section 1), differentiable by
autograd: the model the compiled op is compared with, and a fallback for
devices the compiler does not target.

Same interface as :func:`attnres.attnres`; accumulates in float32 (or
float64 for float64 inputs) and returns the sources' dtype.
"""

import torch


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
    lead = v.shape[1:-1]
    logits = scale * torch.einsum("l...r,mr->ml...", k, q)   # [M, L, ...]
    lse = torch.logsumexp(logits, dim=1)                      # [M, ...]
    p = torch.exp(logits - lse.unsqueeze(1))
    o = torch.einsum("ml...,l...d->m...d", p, v)              # [M, ..., D]
    if output_norm_weight is not None:
        h = output_norm_weight.to(compute)
        if h.dim() == 2:
            h = h.reshape((h.shape[0],) + (1,) * len(lead) + (D,))
        o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + eps) * h
    o = o.to(dtype)
    if not multi:
        o, lse = o.squeeze(0), lse.squeeze(0)
    return (o, lse) if return_lse else o


def attnres_backward_reference(sources, query, grad, *, key_norm_weight=None,
                               output_norm_weight=None, eps=1e-6, scale=1.0):
    """The gradients by the formulas of docs/Math.md section 2 (not autograd):
    returns (d sources [L, ..., D], dq, dg or None, dh or None) for the
    output gradient `grad` ([..., D], or [M, ..., D] for a 2-D query)."""
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
    p = torch.softmax(scale * ell, dim=1)
    o_pre = torch.einsum("mln,lnd->mnd", p, v)
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
