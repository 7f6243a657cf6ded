#!/usr/bin/env python3
"""Runs every GPU case (test/Integration/GPU/cases.py) on an NVIDIA GPU from the kernel
bundles make_bundles.py compiled, and compares each result with a float64
PyTorch reference written from docs/Math.md on fresh random inputs.

* Outputs are filled with NaN before every launch: an element a kernel does
  not write fails.
* The forward runs unsplit and split over sources (P = 2, 3 and L where
  they differ), and where the bundle has a clustered forward (sm_90) also
  that at P = 2, 3 and min(8, L); the backward with (blocks of tokens, partitions of the
  sources) B x P = 1 x 1, 7 x 2, 3 x 3 and 128 x L: the launch rules of the
  manifest, with the counts forced.
* Tolerance: an error passes when it is within rtol * max|ref| (1e-5 for f32
  storage, 1e-2 for bf16, as in the CPU numerics; for the token reductions
  dq, dg and dh, max|ref| or the largest sum of absolute terms) or within 8x the error of
  the same reference computed in float32 (which bounds what conditioning
  alone allows: a gradient that cancels to nearly nothing, or logits of 1e4
  whose FP32 rounding moves the softmax).
* save=o_pre_residual: the o_pre that the stored bf16 values and their
  residual decode to must be within 3e-4 of max|o_pre| (bf16 alone: 2e-3);
  the backward gets a residual encoded from the float64 o_pre, and the
  reference uses the o_pre it decodes to.

Prints a line per case, a summary table last, and writes results.json into
--out.
"""

import argparse
import ctypes
import json
import math
import pathlib
import sys
import time

import numpy as np
import torch

# The residual of a 16-bit o_pre, as the dialect defines it (the reference
# module needs nothing but PyTorch).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "python"))
from attnres.reference import (decode_o_pre, o_pre_residual,  # noqa: E402
                               residual_steps)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
RTOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 1e-2,
        # o_pre decoded from bf16 and its residual: ulp / 28 <= 2^-7 / 28 of
        # the value; bf16 alone is off by up to 2^-9 of the largest values.
        "residual": 3e-4}


def ceil_div(a, b):
    return -(-a // b)


class Bundle:
    """The kernels of one bundle and the launch rules of its manifest."""

    def __init__(self, folder, dry_run):
        self.manifest = json.loads((folder / "manifest.json").read_text())
        self.kernels = {k["name"]: k for k in self.manifest["kernels"]}
        self.dry_run = dry_run
        self.modules = {}
        if not dry_run:
            import cupy
            for binary in self.manifest["binaries"]:
                self.modules[binary["module"]] = cupy.RawModule(
                    path=str(folder / binary["file"]))

    def op(self, kind):
        return next(o for o in self.manifest["ops"] if o["op"] == kind)

    def launch(self, name, values, symbols):
        description = self.kernels[name]
        grid = []
        for dim in description["grid"]:
            value = 1 if dim["symbol"] == "1" else symbols[dim["symbol"]]
            grid.append(ceil_div(value * dim["scale"], dim["divisor"]))
        arguments = []
        for argument in description["arguments"]:
            value = values[argument["name"]]
            if argument["kind"] == "i64":
                arguments.append(np.int64(value))
            else:
                # Kernels index rows of dense row-major buffers.
                if not value.is_contiguous():
                    raise ValueError(f"{name}: argument {argument['name']} "
                                     "is not contiguous")
                arguments.append(np.uint64(value.data_ptr()))
        if self.dry_run or min(grid) == 0:
            return
        function = self.modules[description["module"]].get_function(name)
        if description.get("cluster_y"):
            launch_cluster(function, grid, description["block"], arguments)
            return
        function(tuple(grid), (description["block"], 1, 1), tuple(arguments))


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute (cuda.h), holding a cluster dimension."""
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4),
                ("dims", ctypes.c_uint * 3), ("rest", ctypes.c_char * 52)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h)."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attributes", ctypes.POINTER(_LaunchAttribute)),
                ("count", ctypes.c_uint)]


def launch_cluster(function, grid, block, arguments):
    """A kernel whose blocks along y form one cluster (manifest cluster_y),
    through the driver's cuLaunchKernelEx, which CuPy does not wrap."""
    driver = ctypes.CDLL("libcuda.so.1")
    attribute = _LaunchAttribute(id=4)  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attribute.dims[:] = [1, grid[1], 1]
    config = _LaunchConfig(shared_bytes=0, stream=None, count=1,
                           attributes=ctypes.pointer(attribute))
    config.grid[:] = grid
    config.block[:] = [block, 1, 1]
    values = [ctypes.c_int64(int(a)) if isinstance(a, np.int64)
              else ctypes.c_uint64(int(a)) for a in arguments]
    pointers = (ctypes.c_void_p * len(values))(
        *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    handle = function.kernel.ptr  # the CUfunction of a cupy.RawKernel
    result = driver.cuLaunchKernelEx(ctypes.byref(config),
                                     ctypes.c_void_p(handle), pointers, None)
    if result:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUDA error {result}")


def pointer_table(tensors, device):
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64,
                        device=device)


def poisoned(shape, dtype, device):
    if dtype == torch.int8:
        # Two residuals of -8, which no encoder writes.
        return torch.full(shape, -120, dtype=dtype, device=device)
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def check_residual(report, name, rounded, residual, exact64):
    """The o_pre that the kernel's 16-bit values and residual decode to,
    against the float64 o_pre; the residual is never -8 (unwritten)."""
    if (residual_steps(residual) == -8).any():
        report.failures.append(f"{name}: unwritten residual bytes")
        return
    decoded = decode_o_pre(rounded, residual)
    report.check(name, decoded, exact64, exact64, "residual")


# --------------------------------------------------------------------------
# The reference, from docs/Math.md (sections 1 and 2)
# --------------------------------------------------------------------------

def ref_forward(v, q, g, h, eps, scale):
    """v [L, N, D], q [M, R], g [R] or None, h [D] or [M, D] or None."""
    D, R = v.shape[-1], q.shape[-1]
    t = v[..., D - R:]
    rho = torch.rsqrt((t * t).mean(-1) + eps)                 # [L, N]
    a = q * g if g is not None else q                         # [M, R]
    ell = rho[None] * torch.einsum("lnr,mr->mln", t, a)       # [M, L, N]
    z = scale * ell
    lse = torch.logsumexp(z, dim=1)                           # [M, N]
    p = torch.exp(z - lse[:, None])
    o_pre = torch.einsum("mln,lnd->mnd", p, v)
    o = o_pre
    if h is not None:
        rho_o = torch.rsqrt((o_pre * o_pre).mean(-1, keepdim=True) + eps)
        o = o_pre * rho_o * (h if h.dim() == 1 else h[:, None, :])
    return o, lse, o_pre


def ref_backward(v, q, g, h, grad, lse, saved, eps, scale, magnitudes=False):
    """docs/Math.md section 2, with the saved o_pre (or recomputed)."""
    D, R = v.shape[-1], q.shape[-1]
    t = v[..., D - R:]
    rho = torch.rsqrt((t * t).mean(-1) + eps)                 # [L, N]
    a = q * g if g is not None else q
    khat = rho[..., None] * t                                 # [L, N, R]
    ell = torch.einsum("lnr,mr->mln", khat, a)                # [M, L, N]
    # One source's weight is 1 whatever the lse given (an lse rounded to f32
    # differs from the logit).
    p = torch.ones_like(ell) if v.shape[0] == 1 else \
        torch.exp(scale * ell - lse[:, None])
    o_pre = saved if saved is not None else torch.einsum("mln,lnd->mnd", p, v)
    dh = None
    if h is not None:
        hw = h if h.dim() == 1 else h[:, None, :]
        rho_o = torch.rsqrt((o_pre * o_pre).mean(-1, keepdim=True) + eps)
        xhat = o_pre * rho_o
        d_pre = rho_o * (hw * grad - xhat * (xhat * hw * grad).mean(-1, True))
        dh = (xhat * grad).sum(dim=(0, 1) if h.dim() == 1 else 1)
    else:
        d_pre = grad
    delta = (d_pre * o_pre).sum(-1)                           # [M, N]
    dots = torch.einsum("mnd,lnd->mln", d_pre, v)
    ds = scale * p * (dots - delta[:, None])                  # [M, L, N]
    dv = torch.einsum("mln,mnd->lnd", p, d_pre)
    key = ds[..., None] * rho[None, ..., None] * (
        a[:, None, None, :] - khat[None] * ell[..., None] / R)
    dv[..., D - R:] += key.sum(0)
    da = torch.einsum("mln,lnr->mr", ds, khat)
    dq = da * g if g is not None else da
    dg = (da * q).sum(0) if g is not None else None
    if not magnitudes:
        return dv, dq, dg, dh
    # The sums of the absolute values of the terms of each token reduction:
    # what FP32 accumulation error is proportional to.
    da_abs = torch.einsum("mln,lnr->mr", ds.abs(), khat.abs())
    dq_abs = da_abs * g.abs() if g is not None else da_abs
    dg_abs = (da_abs * q.abs()).sum(0) if g is not None else None
    dh_abs = None
    if h is not None:
        dh_abs = (xhat * grad).abs().sum(dim=(0, 1) if h.dim() == 1 else 1)
    return dv, dq, dg, dh, dq_abs, dg_abs, dh_abs


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------

class Report:
    def __init__(self):
        self.worst = 0.0
        self.failures = []

    def check(self, name, got, ref64, ref32, storage, magnitude=None):
        got = got.detach().double().cpu()
        ref64 = ref64.detach().double().cpu()
        ref32 = ref32.detach().double().cpu()
        finite = torch.isfinite(ref64)
        if (~torch.isfinite(got) & finite).any():
            self.failures.append(f"{name}: NaN/inf or unwritten elements")
            return
        if not torch.equal(got[~finite], ref64[~finite]):
            self.failures.append(f"{name}: non-finite values differ")
            return
        if not finite.any():
            return
        error = (got - ref64)[finite].abs().max().item()
        scale = ref64[finite].abs().max().item()
        error32 = (ref32 - ref64)[finite].abs().max().item()
        size = scale
        if magnitude is not None:
            size = max(size, magnitude.detach().double().cpu().max().item())
        tolerance = max(RTOL[storage] * size, 8 * error32, 1e-30)
        relative = error / scale if scale > 0 else error
        self.worst = max(self.worst, relative)
        if error > tolerance:
            self.failures.append(
                f"{name}: error {error:.3e} > tolerance {tolerance:.3e} "
                f"(max|ref| {scale:.3e})")

    def exact(self, name, got, expected):
        """`got` must equal `expected` bit for bit (after the same cast)."""
        got = got.detach().cpu()
        expected = expected.detach().to(got.dtype).cpu().expand_as(got)
        if not torch.equal(got, expected):
            differ = (got != expected).sum().item()
            self.failures.append(f"{name}: not exact ({differ} of "
                                 f"{got.numel()} values differ)")

    def one_source(self, c, tag, x, o=None, o_pre=None, dv=None, dq=None,
                   dg=None):
        """With one source its softmax weight is 1, whatever the rounding
        of the logits: o (or o_pre, with an output norm) is the source for
        every query, dq and dg are zero and, with one query and no output
        norm, dv is do, all exactly in every save mode. No-op for L > 1."""
        if c["L"] != 1:
            return
        M, N, D = c["M"], c["N"], c["D"]
        v = x["v"].reshape(1, N, D)
        mixed = o_pre if c["output_norm"] else o
        if mixed is not None:
            self.exact(f"{tag} one source: o_pre = v", mixed.reshape(M, N, D),
                       v)
        for name, grad in (("dq", dq), ("dg", dg)):
            if grad is not None:
                self.exact(f"{tag} one source: {name} = 0", grad,
                           torch.zeros_like(grad))
        if dv is not None and M == 1 and not c["output_norm"]:
            self.exact(f"{tag} one source: dv = do", dv.reshape(1, N, D),
                       x["grad"].reshape(1, N, D))


# --------------------------------------------------------------------------
# attnres cases
# --------------------------------------------------------------------------

def make_inputs(c, device):
    gen = torch.Generator().manual_seed(c["seed"])
    L, D, R, M, N = c["L"], c["D"], c["R"], c["M"], c["N"]
    T, Tp = DTYPES[c["dtype"]], DTYPES[c["param_dtype"]]

    def randn(*shape, mean=0.0, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std \
            + mean

    source_scale = 1e-4 if c["inputs"] == "near_zero" else 1.0
    query_scale = 2.0 / math.sqrt(R)
    if c["inputs"] == "large_logits":
        query_scale = 1e4 / math.sqrt(R) / abs(c["scale"])
    x = dict(
        v=randn(L, N, D, std=source_scale).to(T),
        q=randn(M, R, std=query_scale).to(Tp),
        g=randn(R, mean=1.0, std=0.2).to(Tp) if c["key_norm"] else None,
        h=(randn(M if c["per_query"] else 1, D, mean=1.0, std=0.2)
           .to(Tp) if c["output_norm"] else None),
        grad=randn(M, N, D).to(T))
    if c["inputs"] == "zero_query":
        x["q"].zero_()
    if x["h"] is not None and not c["per_query"]:
        x["h"] = x["h"][0]
    return {k: (t.to(device) if t is not None else None) for k, t in x.items()}


def as_kernel_query(c, q):
    # The kernels read [M, R] rows whatever the op's query rank.
    return q.contiguous()


def source_buffers(c, v):
    """Device buffers for the sources, and the pointer table."""
    if c["packed"]:
        packed = v.contiguous()
        return [packed], [packed[l] for l in range(v.shape[0])]
    separate = [v[l].clone() for l in range(v.shape[0])]
    return separate, separate


def prepare_forward(bundle, c, x, partitions, device, clustered=False):
    """Buffers and launches of a forward with `partitions` partitions, merged
    by a merge kernel or, `clustered`, in the cluster of a row's blocks."""
    op = bundle.op("forward")
    L, D, M, N = c["L"], c["D"], c["M"], c["N"]
    T = DTYPES[c["dtype"]]
    keep, rows = source_buffers(c, x["v"])
    out = dict(o=poisoned((M, N, D), T, device),
               lse=poisoned((M, N), torch.float32, device))
    if op["writes_o_pre"]:
        out["o_pre"] = poisoned((M, N, D), T, device)
    if op.get("writes_o_pre_residual"):
        out["o_pre_residual"] = poisoned((M, N, D // 2), torch.int8, device)
    values = dict(sources=pointer_table(rows, device),
                  query=as_kernel_query(c, x["q"]), key_norm=x["g"],
                  output_norm=x["h"], num_tokens=N, keep=keep, **out)
    if partitions == 1:
        launches = [(op["forward"], {"N": N})]
    elif clustered:
        values.update(num_partitions=partitions)
        launches = [(op["forward_cluster"], {"N": N, "P": partitions})]
    else:
        values.update(
            partial_o=torch.empty((partitions, M, N, D), dtype=torch.float32,
                                  device=device),
            partial_lse=torch.empty((partitions, M, N), dtype=torch.float32,
                                    device=device),
            num_partitions=partitions, num_rows=M * N, rows_per_weight=N)
        launches = [(op["forward_partial"], {"N": N, "P": partitions}),
                    (op["merge"], {"rows": M * N})]
    return values, launches, out


def prepare_backward(bundle, c, x, saved_inputs, blocks, partitions, device):
    """Buffers and launches of a backward over `blocks` blocks of tokens and
    `partitions` partitions of the sources."""
    op = bundle.op("backward")
    L, D, R, M, N = c["L"], c["D"], c["R"], c["M"], c["N"]
    T, Tp = DTYPES[c["dtype"]], DTYPES[c["param_dtype"]]
    keep, rows = source_buffers(c, x["v"])
    if c["packed"]:
        grad_packed = poisoned((L, N, D), T, device)
        grad_rows = [grad_packed[l] for l in range(L)]
    else:
        grad_rows = [poisoned((N, D), T, device) for _ in range(L)]
    # docs/Bundle.md: one partial row a block where its row groups add
    # theirs first; a manifest without the fact wrote one a row group.
    G = op.get("partial_rows_per_block", op["rows_per_block"])
    partial_rows = partitions * blocks * G
    weight_rows = M if c["per_query"] else 1
    out = dict(dq=poisoned(tuple(x["q"].shape), Tp, device))
    if x["g"] is not None:
        out["dg"] = poisoned((R,), Tp, device)
    if x["h"] is not None:
        out["dh"] = poisoned(tuple(x["h"].shape), Tp, device)
    values = dict(
        sources=pointer_table(rows, device), query=as_kernel_query(c, x["q"]),
        key_norm=x["g"], output_norm=x["h"], grad=x["grad"],
        lse=saved_inputs["lse"], saved=saved_inputs.get("saved"),
        saved_residual=saved_inputs.get("saved_residual"),
        grad_sources=pointer_table(grad_rows, device),
        partial_da=torch.empty((partial_rows, M, R), dtype=torch.float32,
                               device=device),
        partial_dh=torch.empty((partial_rows, weight_rows, D),
                               dtype=torch.float32, device=device),
        num_tokens=N, num_blocks=blocks, num_partitions=partitions,
        num_partial_rows=partial_rows,
        keep=(keep, grad_rows), **out)
    out["grad_rows"] = grad_rows
    launches = [(op["backward"], {"B": blocks, "P": partitions}),
                (op["finalize"], {})]
    return values, launches, out


def execute(bundle, values, launches):
    for name, symbols in launches:
        bundle.launch(name, values, symbols)


def run_forward(bundle, c, x, partitions, device, clustered=False):
    values, launches, out = prepare_forward(bundle, c, x, partitions, device,
                                            clustered)
    execute(bundle, values, launches)
    return out


def run_backward(bundle, c, x, saved_inputs, blocks, partitions, device):
    values, launches, out = prepare_backward(bundle, c, x, saved_inputs,
                                             blocks, partitions, device)
    execute(bundle, values, launches)
    out["dv"] = torch.stack(out.pop("grad_rows"))
    return out


def attnres_case(bundle, c, device, report, dry_run):
    x = make_inputs(c, device)
    eps, scale = c["eps"], c["scale"]

    def reference(dtype):
        y = {k: (t.to(dtype) if t is not None else None) for k, t in x.items()}
        return y, ref_forward(y["v"], y["q"], y["g"], y["h"], eps, scale)

    x64, (o64, lse64, opre64) = reference(torch.float64)
    x32, (o32, lse32, opre32) = reference(torch.float32)
    # einsum may return permuted views; buffers must be dense.
    o64, lse64, opre64 = (t.contiguous() for t in (o64, lse64, opre64))
    L = c["L"]
    partitions = sorted({1, min(2, L), min(3, L), L})
    # The clustered forward (sm_90 bundles, where it fits) at every split
    # count a cluster holds, next to the partial kernel and the merge.
    runs = [(P, False) for P in partitions]
    if "forward_cluster" in bundle.op("forward"):
        runs += [(P, True) for P in sorted({min(2, L), min(3, L), min(8, L)})
                 if P > 1]
    for P, clustered in runs:
        out = run_forward(bundle, c, x, P, device, clustered)
        if dry_run:
            continue
        tag = f"P={P}" + (" cluster" if clustered else "")
        report.check(f"o {tag}", out["o"], o64, o32, c["dtype"])
        report.check(f"lse {tag}", out["lse"], lse64, lse32, "f32")
        if "o_pre" in out:
            report.check(f"o_pre {tag}", out["o_pre"], opre64, opre32,
                         c["dtype"])
        if "o_pre_residual" in out:
            check_residual(report, f"o_pre+residual {tag}",
                           out.get("o_pre", out["o"]), out["o_pre_residual"],
                           opre64)
        report.one_source(c, tag, x, o=out["o"], o_pre=out.get("o_pre"))

    # The backward takes the forward's saved results as a forward would have
    # stored them; the reference uses the same stored values.
    T = DTYPES[c["dtype"]]
    saved_inputs = {"lse": lse64.to(torch.float32)}
    saved_value = None
    if c["save"] != "lse":
        exact = opre64 if c["output_norm"] else o64
        saved_value = exact.to(T).contiguous()
        saved_inputs["saved"] = saved_value
    if c["save"] == "o_pre_residual":
        # What the forward stores, and the o_pre it stands for.
        residual = o_pre_residual(exact.float(), T).contiguous()
        saved_inputs["saved_residual"] = residual
        saved_value = decode_o_pre(saved_value, residual)

    def reference_backward(dtype, magnitudes=False):
        y = {k: (t.to(dtype) if t is not None else None) for k, t in x.items()}
        stored = saved_value.to(dtype) if saved_value is not None else None
        return ref_backward(y["v"], y["q"], y["g"], y["h"], y["grad"],
                            saved_inputs["lse"].to(dtype), stored, eps, scale,
                            magnitudes)

    dv64, dq64, dg64, dh64, dq_abs, dg_abs, dh_abs = reference_backward(
        torch.float64, magnitudes=True)
    dv32, dq32, dg32, dh32 = reference_backward(torch.float32)
    for B, P in [(1, 1), (7, min(2, L)), (3, min(3, L)), (128, L)]:
        out = run_backward(bundle, c, x, saved_inputs, B, P, device)
        if dry_run:
            continue
        tag = f"B={B} P={P}"
        report.check(f"dv {tag}", out["dv"], dv64, dv32, c["dtype"])
        report.check(f"dq {tag}", out["dq"], dq64, dq32, c["param_dtype"],
                     dq_abs)
        if dg64 is not None:
            report.check(f"dg {tag}", out["dg"], dg64, dg32, c["param_dtype"],
                         dg_abs)
        if dh64 is not None:
            report.check(f"dh {tag}", out["dh"], dh64, dh32, c["param_dtype"],
                         dh_abs)
        report.one_source(c, tag, x, dv=out["dv"], dq=out["dq"],
                          dg=out.get("dg"))


# --------------------------------------------------------------------------
# partition_reduce cases
# --------------------------------------------------------------------------

def ref_merge(partials, lse, sink):
    """docs/Math.md section 3, row by row, in float64."""
    P, rows, D = partials.shape
    m = lse.max(0).values
    if sink is not None:
        m = torch.maximum(m, sink)
    o = torch.zeros(rows, D, dtype=torch.float64)
    out_lse = torch.full((rows,), -math.inf, dtype=torch.float64)
    for r in range(rows):
        mr = m[r].item()
        if mr == -math.inf:
            continue

        def weight(x):
            if x == -math.inf:
                return 0.0
            if math.isinf(mr):
                return 1.0 if x == mr else 0.0
            return math.exp(x - mr)
        total = weight(sink[r].item()) if sink is not None else 0.0
        for p in range(P):
            total += weight(lse[p, r].item())
        for p in range(P):
            w = weight(lse[p, r].item())
            if w > 0:
                o[r] += w * partials[p, r] / total
        out_lse[r] = mr if math.isinf(mr) else mr + math.log(total)
    return o, out_lse


def merge_inputs(c):
    """FP32 partials, lse and sink with the case's empty partitions (lse =
    -inf, rows of inf and NaN) and sinks, and an output-norm weight (float64;
    the caller rounds it to its type)."""
    gen = torch.Generator().manual_seed(c["seed"])
    P, D, rows = c["P"], c["D"], c["rows"]
    partials = torch.randn(P, rows, D, generator=gen, dtype=torch.float64)
    lse = torch.randn(P, rows, generator=gen, dtype=torch.float64) * 3
    sink = torch.randn(rows, generator=gen, dtype=torch.float64) * 3
    for r in range(rows):
        all_empty = c["empty"] == "all" or (c["empty"] == "rows" and r % 2 == 0)
        for p in range(P):
            if all_empty or (c["empty"] == "some" and
                             torch.rand(1, generator=gen).item() < 1 / 3):
                lse[p, r] = -math.inf
                partials[p, r, 0::2] = math.inf
                partials[p, r, 1::2] = math.nan
        if c["sink"] == "-inf":
            sink[r] = -math.inf
        if c["sink"] == "+inf" and r % 2 == 0:
            sink[r] = math.inf
    h = torch.randn(D, generator=gen, dtype=torch.float64) * 0.2 + 1
    return partials.float(), lse.float(), sink.float(), h


def merge_case(bundle, c, device, report, dry_run):
    P, D, rows = c["P"], c["D"], c["rows"]
    T = DTYPES[c["dtype"]]
    partials, lse, sink, h = (t.double() for t in merge_inputs(c))
    use_sink = c["sink"] != "none"
    o64, lse64 = ref_merge(partials, lse, sink if use_sink else None)
    if c["output_norm"]:
        h = h.to(T).double()
        o_pre64 = o64
        o64 = o64 * torch.rsqrt((o64 * o64).mean(-1, True) + 1e-6) * h
    op = bundle.op("partition_reduce_softmax")
    out = dict(o=poisoned((rows, D), T, device),
               lse=poisoned((rows,), torch.float32, device))
    if c["output_norm"]:
        out["o_pre"] = poisoned((rows, D), T, device)
    if c["residual"]:
        out["o_pre_residual"] = poisoned((rows, D // 2), torch.int8, device)
    values = dict(partial_o=partials.float().to(device),
                  partial_lse=lse.float().to(device),
                  sink=sink.float().to(device) if use_sink else None,
                  output_norm=h.to(T).to(device) if c["output_norm"] else None,
                  num_rows=rows, num_partitions=P, **out)
    bundle.launch(op["merge"], values, {"rows": rows})
    if dry_run:
        return
    # Inputs are exact in FP32, so the FP32 reference error bound is the
    # tolerance alone.
    report.check("o", out["o"], o64, o64, c["dtype"])
    report.check("lse", out["lse"], lse64, lse64, "f32")
    if c["output_norm"]:
        report.check("o_pre", out["o_pre"], o_pre64, o_pre64, c["dtype"])
    if c["residual"]:
        check_residual(report, "o_pre+residual",
                       out.get("o_pre", out["o"]), out["o_pre_residual"],
                       o_pre64 if c["output_norm"] else o64)


def sum_case(bundle, c, device, report, dry_run):
    gen = torch.Generator().manual_seed(c["seed"])
    P, S = c["P"], c["S"]
    partials = torch.randn(P, S, generator=gen, dtype=torch.float64).float()
    ref = partials.double().sum(0)
    out = poisoned((S,), DTYPES[c["dtype"]], device)
    op = bundle.op("partition_reduce_sum")
    bundle.launch(op["sum"], dict(partials=partials.to(device), output=out,
                                  num_elements=S), {"N": S})
    if dry_run:
        return
    ref32 = partials.sum(0)
    report.check("sum", out, ref, ref32, c["dtype"])


# --------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, type=pathlib.Path,
                        help="the folder make_bundles.py wrote")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--filter", default="")
    parser.add_argument("--dry-run", action="store_true",
                        help="build inputs and references, launch nothing")
    args = parser.parse_args()

    device = "cpu" if args.dry_run else "cuda"
    cases = json.loads((args.cases / "cases.json").read_text())
    cases = [c for c in cases if c["id"].startswith(args.filter)]
    results, passed = [], 0
    start = time.time()
    for c in cases:
        report = Report()
        try:
            bundle = Bundle(args.cases / "bundles" / c["id"], args.dry_run)
            if c["kind"] == "attnres":
                attnres_case(bundle, c, device, report, args.dry_run)
            elif c["kind"] == "merge":
                merge_case(bundle, c, device, report, args.dry_run)
            else:
                sum_case(bundle, c, device, report, args.dry_run)
            if not args.dry_run:
                torch.cuda.synchronize()
        except Exception as error:  # a failing case must not stop the run
            report.failures.append(f"exception: {error!r}")
        ok = not report.failures
        passed += ok
        label = c.get("spec") or f"{c['kind']} P={c['P']} " + " ".join(
            f"{k}={c[k]}" for k in ("sink", "empty", "D", "dtype",
                                    "output_norm", "S") if k in c)
        print(f"{'PASS' if ok else 'FAIL'} {c['id']} {label} "
              f"worst={report.worst:.2e}"
              + ("" if ok else "  " + "; ".join(report.failures[:4])),
              flush=True)
        results.append(dict(id=c["id"], ok=ok, worst=report.worst,
                            failures=report.failures, case=label))
    elapsed = time.time() - start
    by_kind = {}
    for c, r in zip(cases, results):
        kind = c["kind"] if c["kind"] != "attnres" else (
            "edge" if c["id"].startswith("e") else f"matrix-{c['dtype']}")
        total, good = by_kind.get(kind, (0, 0))
        by_kind[kind] = (total + 1, good + r["ok"])
    print()
    print(f"{'group':<14} {'cases':>6} {'passed':>7}")
    for kind, (total, good) in sorted(by_kind.items()):
        print(f"{kind:<14} {total:>6} {good:>7}")
    print(f"total: {passed} of {len(cases)} cases passed in {elapsed:.0f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    return 0 if passed == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
