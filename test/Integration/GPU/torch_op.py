#!/usr/bin/env python3
"""The PyTorch ops on the GPU: attnres.attnres and attnres.partition_reduce
against the float64 reference of run_cases.py, on the reference matrix and
edge cases of cases.py, in three modes:

* eager: every case; outputs and every gradient (sources, query, key-norm
  and output-norm weights) through autograd;
* compile: torch.compile(fullgraph=True) of the forward and its backward
  (inductor), on a subset of the cases (each compiles its own graph);
* graph: forward and backward captured in one CUDA graph, replayed on new
  input values copied into the captured buffers; every case.

Sources come as a list of [a, b, D] tensors or one packed [L, a, b, D]
tensor; some cases pass non-contiguous sources (the ops copy them).

Run with the package's runtime and bundles prebuilt on a machine with the
compiler (--prebuild DIR there; ATTNRES_BUNDLE_DIR=DIR here).
"""

import argparse
import importlib
import json
import math
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2] / "python"))

import attnres  # noqa: E402
from attnres import _checks  # noqa: E402
from attnres._checks import TensorShape as Shape  # noqa: E402
from attnres.reference import decode_o_pre  # noqa: E402
from cases import edge_cases, matrix, merge_cases  # noqa: E402
from run_cases import (DTYPES, Report, make_inputs,  # noqa: E402
                       merge_inputs, ref_backward, ref_forward, ref_merge)

COMPILE_EVERY = 8  # one case in eight also runs under torch.compile


def attnres_cases(compile_every=COMPILE_EVERY):
    cases = matrix() + edge_cases()
    for index, c in enumerate(cases):
        c["kind"] = "attnres"
        c["compile"] = index % compile_every == 0
        # Every third case splits its tokens over two leading dimensions,
        # every fifth passes non-contiguous sources.
        c["split_tokens"] = index % 3 == 1 and c["N"] % 2 == 0
        c["strided"] = index % 5 == 4
    return cases




def lead_shape(c):
    return (2, c["N"] // 2) if c["split_tokens"] else (c["N"],)


def op_arguments(c, as_tensor):
    """sources, query and weights for attnres.attnres, from `as_tensor(name,
    shape)`."""
    L, D, R, M = c["L"], c["D"], c["R"], c["M"]
    lead = lead_shape(c)
    if c["packed"]:
        sources = as_tensor("v", (L,) + lead + (D,))
    else:
        sources = [as_tensor(f"v{l}", lead + (D,)) for l in range(L)]
    query = as_tensor("q", (M, R) if c["multi_query"] else (R,))
    g = as_tensor("g", (R,)) if c["key_norm"] else None
    h = None
    if c["output_norm"]:
        h = as_tensor("h", (M, D) if c["per_query"] else (D,))
    return sources, query, g, h


def keys():
    """Every kernel key the cases and the training script use."""
    result = set()
    for c in attnres_cases():
        T, Tp = DTYPES[c["dtype"]], DTYPES[c["param_dtype"]]
        sources, query, g, h = op_arguments(
            c, lambda name, shape: Shape(shape, Tp if name in "qgh" else T))
        call = _checks.check_attnres(sources, query, g, h, c["eps"],
                                     c["scale"], op_save(c))
        result.add(call.spec())
    # The training comparison: sublayer i reads i + 1 sources.
    import train_compare as t
    bf16 = torch.bfloat16
    for L in range(1, 2 * t.LAYERS + 2):
        call = _checks.check_attnres(
            [Shape((t.BATCH, t.SEQ, t.D), bf16)] * L, Shape((t.D,), bf16),
            Shape((t.D,), bf16), Shape((t.D,), bf16), 1e-6, 1.0, "o_pre")
        result.add(call.spec())
    for c in PARTIAL_CASES:
        T, Tp = DTYPES[c["dtype"]], DTYPES[c["param_dtype"]]
        R, D, M = c["R"], c["D"], c["M"]
        for count in set(c["groups"]):
            call = _checks.check_attnres(
                Shape((count,) + c["lead"] + (D,), T),
                Shape((R,) if M is None else (M, R), Tp),
                Shape((R,), Tp) if c["key_norm"] else None, None, 1e-5, 0.9,
                "o_pre")
            result.add(call.spec(partial=True))
        out = c["param_dtype"] if c["output_norm"] else "f32"
        key = f"merge:P={len(c['groups'])},D={D},out={out}"
        if c["output_norm"]:
            key += f",output_norm,eps={1e-5!r}"
        result.add(key)
    for c in merge_cases():
        if c["kind"] == "merge":
            out = c["dtype"] if c["output_norm"] else "f32"
            key = f"merge:P={c['P']},D={c['D']},out={out}"
            if c["sink"] != "none":
                key += ",sink"
            if c["output_norm"]:
                key += f",output_norm,eps={1e-6!r}"
            result.add(key)
        else:
            result.add(f"sum:P={c['P']}")
    return sorted(result)


# --------------------------------------------------------------------------

def make_leaves(c, x):
    """Leaf tensors for the op from make_inputs' [L, N, D] etc."""
    L, D = c["L"], c["D"]
    lead = lead_shape(c)
    v = x["v"]
    if c["strided"]:
        # Every source a view with a row stride of 2 D: not dense.
        wide = torch.zeros(v.shape[:-1] + (2 * D,), dtype=v.dtype,
                           device=v.device)
        wide[..., :D] = v
        v = wide[..., :D]
    if c["packed"]:
        sources = v.reshape((L,) + lead + (D,)).detach().requires_grad_()
        leaves = [sources]
    else:
        sources = [v[l].reshape(lead + (D,)).detach().requires_grad_()
                   for l in range(L)]
        leaves = list(sources)
    query = x["q"] if c["multi_query"] else x["q"][0]
    query = query.clone().requires_grad_()
    leaves.append(query)
    g = h = None
    if x["g"] is not None:
        g = x["g"].clone().requires_grad_()
        leaves.append(g)
    if x["h"] is not None:
        h = x["h"].clone().requires_grad_()
        leaves.append(h)
    return sources, query, g, h, leaves


def run_op(c, sources, query, g, h):
    o = attnres.attnres(sources, query, key_norm_weight=g,
                        output_norm_weight=h, eps=c["eps"], scale=c["scale"],
                        save=op_save(c))
    return o


def grads_of(leaves, o, grad):
    return torch.autograd.grad(o, leaves, grad)


def unpack(c, outputs):
    """o [M, N, D] and gradients in the reference's layout."""
    L, D, M, N = c["L"], c["D"], c["M"], c["N"]
    o, grads = outputs[0], list(outputs[1:])
    o = o.reshape(M, N, D)
    if c["packed"]:
        dv = grads.pop(0).reshape(L, N, D)
    else:
        dv = torch.stack([grads.pop(0).reshape(N, D) for _ in range(L)])
    dq = grads.pop(0).reshape(M, -1)
    dg = grads.pop(0) if c["key_norm"] else None
    dh = grads.pop(0) if c["output_norm"] else None
    return o, dv, dq, dg, dh


def op_save(c):
    """The op's save argument: "o_pre" keeps the residual of a 16-bit o_pre
    by itself, so the cases' o_pre_residual is the op's o_pre."""
    return "lse" if c["save"] == "lse" else "o_pre"


def op_saved(c, x):
    """The op's own forward results (o, lse, and what it saves for the
    backward), from torch.ops.attnres.forward directly."""
    v = x["v"].contiguous()
    sources = [v] if c["packed"] else [v[l] for l in range(c["L"])]
    o, lse, o_pre, residual = torch.ops.attnres.forward(
        sources, x["q"].contiguous(), x["g"], x["h"], c["eps"], c["scale"],
        op_save(c))
    saved = None
    if op_save(c) == "o_pre":
        saved = o_pre if c["output_norm"] else o
        if residual.numel():
            # The o_pre the backward reads: bf16 values and their residual.
            saved = decode_o_pre(saved, residual)
    return lse, saved


def references(c, x, lse, saved):
    """The float64 reference. The backward reads the op's own stored lse and
    o_pre (or o), as the op's backward does: rounding them to the storage
    type is the op's design (docs/Math.md section 2), and the reference must
    not charge that rounding to the kernels. The forward check compares
    the stored values themselves with the reference."""
    eps, scale = c["eps"], c["scale"]

    def forward(dtype):
        y = {k: (t.to(dtype) if t is not None else None) for k, t in x.items()}
        return ref_forward(y["v"], y["q"], y["g"], y["h"], eps, scale)

    o64, lse64, opre64 = forward(torch.float64)
    o32, lse32, opre32 = forward(torch.float32)
    stored = dict(lse=(lse, lse64, lse32, "f32"))
    if saved is not None:
        # A float32 saved o_pre of 16-bit storage was decoded with its
        # residual: held to the residual's precision.
        decoded = saved.dtype == torch.float32 and c["dtype"] != "f32"
        stored["saved"] = (saved, opre64 if c["output_norm"] else o64,
                           opre32 if c["output_norm"] else o32,
                           "residual" if decoded else c["dtype"])
    saved = saved.double() if saved is not None else None
    lse = lse.double()

    def backward(dtype, magnitudes=False):
        y = {k: (t.to(dtype) if t is not None else None) for k, t in x.items()}
        return ref_backward(y["v"], y["q"], y["g"], y["h"], y["grad"],
                            lse.to(dtype),
                            saved.to(dtype) if saved is not None else None,
                            eps, scale, magnitudes)

    return dict(o=(o64, o32), stored=stored, inputs=x,
                backward64=backward(torch.float64, True),
                backward32=backward(torch.float32))


def check(c, report, mode, got, ref):
    o, dv, dq, dg, dh = unpack(c, got)
    report.check(f"{mode} o", o, *ref["o"], c["dtype"])
    dv64, dq64, dg64, dh64, dq_abs, dg_abs, dh_abs = ref["backward64"]
    dv32, dq32, dg32, dh32 = ref["backward32"]
    report.check(f"{mode} dv", dv, dv64, dv32, c["dtype"])
    report.check(f"{mode} dq", dq, dq64, dq32, c["param_dtype"], dq_abs)
    if dg64 is not None:
        report.check(f"{mode} dg", dg, dg64, dg32, c["param_dtype"], dg_abs)
    if dh64 is not None:
        report.check(f"{mode} dh", dh.reshape(dh64.shape), dh64, dh32,
                     c["param_dtype"], dh_abs)
    # (o is o_pre where there is no output norm.)
    report.one_source(c, mode, ref["inputs"], o=o, dv=dv, dq=dq, dg=dg)


def frozen_sources(c, report, x, grad, ref, skips_null=True):
    """Eagerly, with the odd sources of a list (a packed source: all of
    it) taking no gradient: the kernel's table of gradient rows has null
    entries for them, which it must neither read nor write (a write
    through one faults), and every other gradient is the same. With
    `skips_null` False, as with a bundle from before the kernels skipped
    null entries (whose backward op lacks the fact): every row gets a
    gradient and the op drops those not wanted."""
    sources, query, g, h, leaves = make_leaves(c, x)
    if c["packed"]:
        kept, sources = [], sources.detach()
    else:
        kept = sources[0::2]
        sources = [s if l % 2 == 0 else s.detach()
                   for l, s in enumerate(sources)]
    weights = leaves[len(leaves) - 1 - (g is not None) - (h is not None):]
    from attnres import ops
    o = run_op(c, sources, query, g, h)
    # The forward made (or found) the call's plan, which its backward reads.
    plans = [p for p in ops._plans.values() if p]
    for plan in plans:
        plan.backward.skips_null_gradients = skips_null
    try:
        got = grads_of(kept + weights, o, grad)
    finally:
        for plan in plans:
            plan.backward.skips_null_gradients = True
    name = "frozen" if skips_null else "frozen, older bundle,"
    dv64, dq64, dg64, dh64, dq_abs, dg_abs, dh_abs = ref["backward64"]
    dv32, dq32, dg32, dh32 = ref["backward32"]
    N, D = c["N"], c["D"]
    if kept:
        dv = torch.stack([t.reshape(N, D) for t in got[:len(kept)]])
        report.check(f"{name} dv", dv, dv64[0::2], dv32[0::2], c["dtype"])
    got = list(got[len(kept):])
    report.check(f"{name} dq", got.pop(0).reshape(c["M"], -1), dq64, dq32,
                 c["param_dtype"], dq_abs)
    if dg64 is not None:
        report.check(f"{name} dg", got.pop(0), dg64, dg32,
                     c["param_dtype"], dg_abs)
    if dh64 is not None:
        report.check(f"{name} dh", got.pop(0).reshape(dh64.shape), dh64,
                     dh32, c["param_dtype"], dh_abs)


def attnres_case(c, report, device, modes):
    x = make_inputs(c, device)
    lse, saved = op_saved(c, x)
    ref = references(c, {k: (t.cpu() if t is not None else None)
                         for k, t in x.items()},
                     lse.cpu(), saved.cpu() if saved is not None else None)
    for name, (got, ref64, ref32, storage) in ref["stored"].items():
        report.check(f"stored {name}", got, ref64, ref32, storage)
    grad = x["grad"].reshape((c["M"],) + lead_shape(c) + (c["D"],))
    if not c["multi_query"]:
        grad = grad[0]

    if "eager" in modes:
        sources, query, g, h, leaves = make_leaves(c, x)
        o = run_op(c, sources, query, g, h)
        check(c, report, "eager", (o,) + grads_of(leaves, o, grad), ref)
        frozen_sources(c, report, x, grad, ref)
        frozen_sources(c, report, x, grad, ref, skips_null=False)

    # torch.compile(fullgraph=True), forward and backward
    if c["compile"] and "compile" in modes:
        torch._dynamo.reset()
        compiled = torch.compile(
            lambda s, q, g_, h_: run_op(c, s, q, g_, h_), fullgraph=True)
        sources, query, g, h, leaves = make_leaves(c, x)
        o = compiled(sources, query, g, h)
        check(c, report, "compile", (o,) + grads_of(leaves, o, grad),
              ref)

    # CUDA graph: capture forward + backward on placeholder values, then
    # copy the case's inputs into the captured buffers and replay.
    if "graph" not in modes:
        return
    sources, query, g, h, leaves = make_leaves(c, x)
    values = [t.detach().clone() for t in leaves]
    static_grad = grad.clone()
    with torch.no_grad():
        for t in leaves:
            t.normal_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up: kernels loaded, tables cached
            o = run_op(c, sources, query, g, h)
            grads_of(leaves, o, static_grad)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o = run_op(c, sources, query, g, h)
        static_grads = grads_of(leaves, static_o, static_grad)
    with torch.no_grad():
        for t, value in zip(leaves, values):
            t.copy_(value)
        for t in (static_o,) + tuple(static_grads):
            t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(c, report, "graph", (static_o,) + tuple(static_grads), ref)


# --------------------------------------------------------------------------

def merge_reference64(partials, lse, sink, h, grad_o, grad_lse, eps=1e-6):
    """Forward by ref_merge; gradients by float64 autograd through the
    formula of docs/Math.md section 3 written with masks (empty partitions and
    rows give exact zeros)."""
    p = partials.double().requires_grad_()
    l = lse.double().requires_grad_()
    s = sink.double().requires_grad_() if sink is not None else None
    hw = h.double().requires_grad_() if h is not None else None
    m = l.max(0).values
    if s is not None:
        m = torch.maximum(m, s)
    finite_m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    empty = torch.isneginf(l)
    w = torch.where(empty, 0.0, torch.exp(torch.where(empty, 0.0, l)
                                          - finite_m))
    w = torch.where(torch.isposinf(m) & ~empty, (l == m).double(), w)
    total = w.sum(0)
    if s is not None:
        sw = torch.where(torch.isneginf(s), 0.0,
                         torch.exp(torch.where(torch.isinf(s), 0.0, s)
                                   - finite_m))
        sw = torch.where(torch.isposinf(s), 1.0, sw)
        total = total + sw
    safe = torch.where(total > 0, total, torch.ones_like(total))
    values = torch.where(empty.unsqueeze(-1), 0.0, p)
    o = (w.unsqueeze(-1) * values).sum(0) / safe.unsqueeze(-1)
    out_lse = torch.where(total > 0, finite_m + torch.log(safe),
                          torch.full_like(total, -math.inf))
    out_lse = torch.where(torch.isposinf(m), m, out_lse)
    if hw is not None:
        o = o * torch.rsqrt((o * o).mean(-1, True) + eps) * hw
    inputs = [p, l] + ([s] if s is not None else []) + \
        ([hw] if hw is not None else [])
    finite_lse = torch.where(torch.isfinite(out_lse), out_lse, 0.0)
    loss = (o * grad_o.double()).sum() + (finite_lse * grad_lse.double()).sum()
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return o.detach(), out_lse.detach(), grads


def merge_case(c, report, device):
    partials, lse, sink, h = merge_inputs(c)
    use_sink = c["sink"] != "none"
    T = DTYPES[c["dtype"]] if c["output_norm"] else torch.float32
    hT = h.to(T) if c["output_norm"] else None
    o64, lse64 = ref_merge(partials.double(), lse.double(),
                           sink.double() if use_sink else None)
    gen = torch.Generator().manual_seed(c["seed"] + 1)
    grad_o = torch.randn(c["rows"], c["D"], generator=gen)
    grad_lse = torch.randn(c["rows"], generator=gen)
    _, _, grads64 = merge_reference64(
        partials, lse, sink if use_sink else None,
        hT.double() if hT is not None else None, grad_o, grad_lse)

    inputs = [partials.to(device).requires_grad_(),
              lse.to(device).requires_grad_()]
    sink_d = sink.to(device).requires_grad_() if use_sink else None
    h_d = hT.to(device).requires_grad_() if hT is not None else None
    o, out_lse = attnres.partition_reduce(
        inputs[0], inputs[1], sink=sink_d, output_norm_weight=h_d)
    if c["output_norm"]:
        o64 = o64 * torch.rsqrt((o64 * o64).mean(-1, True) + 1e-6) * \
            hT.double()
    storage = c["dtype"] if c["output_norm"] else "f32"
    report.check("merge o", o, o64, o64, storage)
    report.check("merge lse", out_lse, lse64, lse64, "f32")
    # The lse gradient of rows whose merged lse is infinite is not defined;
    # their incoming lse gradient is zeroed in both.
    finite = torch.isfinite(lse64).to(device)
    leaves = inputs + [t for t in (sink_d, h_d) if t is not None]
    grads = torch.autograd.grad(
        (o.float() * grad_o.to(device)).sum() +
        (torch.where(finite, out_lse, 0.0) * grad_lse.to(device)).sum(),
        leaves, allow_unused=True)
    names = ["d partials", "d lse"] + (["d sink"] if use_sink else []) + \
        (["d h"] if hT is not None else [])
    for name, got, ref in zip(names, grads, grads64):
        if ref is None:
            continue
        got = torch.zeros_like(ref) if got is None else got
        # FP32 formulas against float64: the bf16 output's rounding is in o,
        # not in these.
        # The gradients are FP32 formulas of FP32 inputs; a bf16 output's
        # rounding enters through the norm's weights alone.
        report.check(f"merge {name}", got, ref, ref, storage)


# Partial results over groups of sources (attnres.attnres_partial) merged by
# partition_reduce: each partial against float64, the merge against AttnRes
# over all sources, and every gradient of <o, do> + <lse, dlse> (the merge
# hands each partial an lse gradient, which its backward kernel takes).
PARTIAL_CASES = [
    dict(id="p0", groups=[2, 4], lead=(3, 50), D=256, R=64, M=None,
         dtype="bf16", param_dtype="f32", key_norm=True, output_norm=True),
    dict(id="p1", groups=[1, 4], lead=(97,), D=128, R=128, M=3,
         dtype="f32", param_dtype="f32", key_norm=False, output_norm=False),
    dict(id="p2", groups=[3, 3, 3], lead=(2, 129), D=512, R=512, M=2,
         dtype="bf16", param_dtype="bf16", key_norm=True, output_norm=True),
    dict(id="p3", groups=[7, 1], lead=(1000,), D=1024, R=256, M=None,
         dtype="f16", param_dtype="f16", key_norm=False, output_norm=True),
]


def partial_case(c, report, device):
    from attnres.reference import (attnres_partial_reference,
                                   attnres_reference,
                                   partition_reduce_reference)
    gen = torch.Generator().manual_seed(17)
    T, Tp = DTYPES[c["dtype"]], DTYPES[c["param_dtype"]]
    L, D, R, M = sum(c["groups"]), c["D"], c["R"], c["M"]
    sources = torch.randn(L, *c["lead"], D, generator=gen).to(T)
    query = (torch.randn(R, generator=gen) if M is None else
             torch.randn(M, R, generator=gen)) * (2.0 / math.sqrt(R))
    query = query.to(Tp)
    g = (1 + 0.1 * torch.randn(R, generator=gen)).to(Tp) \
        if c["key_norm"] else None
    h = (1 + 0.1 * torch.randn(D, generator=gen)).to(Tp) \
        if c["output_norm"] else None

    def leaves_on(where, dtype=None):
        def move(t):
            if t is None:
                return None
            t = t.to(where) if dtype is None else t.to(where, dtype)
            return t.requires_grad_()
        groups = [move(s) for s in torch.split(sources, c["groups"])]
        return groups, move(query), move(g), move(h)

    def run(groups, q, g_, h_, partial, merge):
        parts = [partial(s, q, key_norm_weight=g_, eps=1e-5, scale=0.9)
                 for s in groups]
        o, lse = merge(torch.stack([p[0] for p in parts]),
                       torch.stack([p[1] for p in parts]),
                       output_norm_weight=h_, eps=1e-5)
        return parts, o, lse

    got_leaves = leaves_on(device)
    parts, o, lse = run(*got_leaves, attnres.attnres_partial,
                        attnres.partition_reduce)
    refs = {}
    for name, dtype in (("64", torch.float64), ("32", torch.float32)):
        leaves = leaves_on("cpu", dtype)
        refs[name] = (leaves,) + run(*leaves, attnres_partial_reference,
                                     partition_reduce_reference)
    (_, parts64, o64, lse64), (_, parts32, o32, _) = refs["64"], refs["32"]
    for k, (got, ref64, ref32) in enumerate(zip(parts, parts64, parts32)):
        report.check(f"partial {k} o", got[0], ref64[0], ref32[0], "f32")
        report.check(f"partial {k} lse", got[1], ref64[1], ref32[1], "f32")
    # The merge is AttnRes over every source.
    whole64 = attnres_reference(
        sources.double(), query.double(),
        key_norm_weight=g.double() if g is not None else None,
        output_norm_weight=h.double() if h is not None else None, eps=1e-5,
        scale=0.9)
    out_storage = c["param_dtype"] if h is not None else "f32"
    report.check("merged o", o, whole64, o32, out_storage)
    report.check("merged o = reference merge", o, o64, o32, out_storage)
    report.check("merged lse", lse, lse64, lse64, "f32")
    grad_o = torch.randn(o.shape, generator=gen)
    grad_lse = torch.randn(lse.shape, generator=gen)

    def gradients(leaves, out, out_lse):
        flat = [t for t in leaves[0] + list(leaves[1:]) if t is not None]
        loss = (out.double() * grad_o.to(out.device).double()).sum() + \
            (out_lse.double() * grad_lse.to(out.device).double()).sum()
        return torch.autograd.grad(loss, flat)
    got_grads = gradients(got_leaves, o, lse)
    ref64_grads = gradients(refs["64"][0], o64, lse64)
    ref32_grads = gradients(refs["32"][0], o32, refs["32"][3])
    names = [f"d group {k}" for k in range(len(c["groups"]))] + \
        ["dq"] + (["dg"] if g is not None else []) + \
        (["dh"] if h is not None else [])
    for name, got, ref64, ref32 in zip(names, got_grads, ref64_grads,
                                       ref32_grads):
        storage = c["dtype"] if name.startswith("d group") else \
            c["param_dtype"]
        report.check(name, got, ref64, ref32, storage)


def sum_case(c, report, device):
    gen = torch.Generator().manual_seed(c["seed"])
    partials = torch.randn(c["P"], 10, c["S"] // 10, generator=gen)
    leaf = partials.to(device).requires_grad_()
    total = attnres.partition_reduce(leaf, mode="sum")
    report.check("sum", total, partials.double().sum(0),
                 partials.sum(0).double(), "f32")
    grad = torch.randn(total.shape, generator=gen).to(device)
    (d,) = torch.autograd.grad(total, leaf, grad)
    report.check("sum grad", d, grad.double().expand(c["P"], -1, -1).cpu(),
                 grad.double().expand(c["P"], -1, -1).cpu(), "f32")


# --------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prebuild", type=pathlib.Path,
                        help="compile every bundle the cases need into this "
                        "folder (on a machine with the compiler) and exit")
    parser.add_argument("--target", default="sm_90")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--filter", default="")
    parser.add_argument("--modes", default="eager,compile,graph")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile-every", type=int, default=COMPILE_EVERY,
                        help="run every n-th attnres case under "
                        "torch.compile too (1: all)")
    args = parser.parse_args()
    if args.prebuild:
        needed = keys()
        attnres.prebuild(needed, args.target, args.prebuild)
        print(f"{len(needed)} bundles in {args.prebuild / args.target}")
        return 0

    # Registers torch.ops.attnres (needs PyTorch >= 2.4; --prebuild does
    # not).
    importlib.import_module("attnres.ops")
    device, modes = args.device, args.modes.split(",")
    torch._dynamo.config.cache_size_limit = 1024
    cases = attnres_cases(args.compile_every) + merge_cases() + \
        [dict(c, kind="partial") for c in PARTIAL_CASES]
    cases = [c for c in cases if c["id"].startswith(args.filter)]
    results, start = [], time.time()
    for c in cases:
        report = Report()
        try:
            if c["kind"] == "attnres":
                attnres_case(c, report, device, modes)
            elif c["kind"] == "merge":
                merge_case(c, report, device)
            elif c["kind"] == "partial":
                partial_case(c, report, device)
            else:
                sum_case(c, report, device)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as error:  # a failing case must not stop the run
            report.failures.append(f"exception: {error!r}")
        ok = not report.failures
        ran = [m for m in modes if m != "compile" or c.get("compile")]
        label = c.get("id")
        print(f"{'PASS' if ok else 'FAIL'} {label} {c['kind']} "
              f"{'+'.join(ran) if c['kind'] == 'attnres' else ''} "
              f"worst={report.worst:.2e}"
              + ("" if ok else "  " + "; ".join(report.failures[:4])),
              flush=True)
        results.append(dict(id=label, kind=c["kind"], ok=ok,
                            compile=bool(c.get("compile")) and "compile" in modes,
                            worst=report.worst, failures=report.failures))
    passed = sum(r["ok"] for r in results)
    compiled = sum(r["compile"] for r in results)
    print(f"\n{passed}/{len(results)} cases pass ({compiled} also under "
          f"torch.compile) in {time.time() - start:.0f} s; "
          f"torch {torch.__version__}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "torch_op.json").write_text(json.dumps(results, indent=1))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
