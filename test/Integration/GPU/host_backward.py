#!/usr/bin/env python3
"""Backwards kept on the host (keep-host=1), whole and split by
attnres-split-reduction, in the shapes host-layer.test leaves out: many
queries with a per-query output norm on short rows (whose split tiles add
their row groups' shares in rounds), a key of R < D coordinates with a key
norm and an lse gradient, separate f32 sources and a recomputed o_pre, a
saved 16-bit o_pre with its residual; and backwards that accumulate into
the source gradients given (accumulate(...): a list and a packed one), whose
rows the kernels read and add to.

`build` writes a module of one backward per case (its token count dynamic),
compiles it with attnres-opt's NVVM pipeline, the host functions kept,
after the given split passes, into a shared library (mlir-translate, llc,
the C compiler, linked against libAttnResRuntime); `run` calls each
library's function on an NVIDIA GPU with PyTorch's device buffers as its
arguments and checks every gradient against a float64 reference of the
formulas of docs/Math.md section 2 (python/attnres/reference.py), within
the tolerance of the GPU cases (run_cases.py: rtol of the storage type, or
8x the float32 reference's error). The two halves run on different machines
where the GPU machine has no LLVM.

Prints a line per library and "host backward: N of N passed" last.
"""

import argparse
import ctypes
import json
import math
import pathlib
import subprocess
import sys
import zlib

HERE = pathlib.Path(__file__).resolve().parent
CASES = [
    # Row groups of 8 lanes adding 16 vectors a thread (8 of dq, 8 of dh) in
    # two rounds: all at once would take more than 32 KiB.
    dict(name="q8_norm_d64", L=4, D=64, R=64, M=8, N=203, dtype="bf16",
         packed=True, key_norm=False, output_norm="per_query", saved="o_pre",
         grad_lse=False, scale=1.0),
    dict(name="q2_key16_lse", L=3, D=64, R=16, M=2, N=150, dtype="f32",
         packed=False, key_norm=True, output_norm=None, saved=None,
         grad_lse=True, scale=0.25),
    dict(name="q1_residual", L=5, D=128, R=128, M=1, N=77, dtype="bf16",
         packed=True, key_norm=True, output_norm="shared", saved="residual",
         grad_lse=False, scale=1.0),
    dict(name="q3_accumulate", L=4, D=128, R=32, M=3, N=131, dtype="bf16",
         packed=False, key_norm=True, output_norm="shared", saved="o_pre",
         grad_lse=False, scale=1.0, accumulate=True),
    dict(name="q1_packed_accumulate", L=6, D=64, R=64, M=1, N=100,
         dtype="f32", packed=True, key_norm=False, output_norm=None,
         saved=None, grad_lse=False, scale=0.5, accumulate=True),
]
# The whole backward (its blocks and partitions the runtime's rules at run
# time), and attnres-split-reduction's loop over B blocks of tokens.
VARIANTS = {"whole": "", "split7": "--attnres-split-reduction=blocks=7",
            "split3": "--attnres-split-reduction=blocks=3"}


def operand_types(c):
    """The function's arguments: (name, MLIR tensor type), in order."""
    L, D, R, M, t = c["L"], c["D"], c["R"], c["M"], c["dtype"]
    lead = f"{M}x" if M > 1 else ""
    args = []
    if c["packed"]:
        args.append(("v", f"tensor<{L}x?x{D}x{t}>"))
    else:
        args += [(f"v{l}", f"tensor<?x{D}x{t}>") for l in range(L)]
    args.append(("q", f"tensor<{lead}{R}x{t}>"))
    if c["key_norm"]:
        args.append(("g", f"tensor<{R}x{t}>"))
    if c["output_norm"] == "shared":
        args.append(("h", f"tensor<{D}x{t}>"))
    elif c["output_norm"] == "per_query":
        args.append(("h", f"tensor<{M}x{D}x{t}>"))
    args.append(("do", f"tensor<{lead}?x{D}x{t}>"))
    args.append(("lse", f"tensor<{lead}?xf32>"))
    if c["saved"]:
        args.append(("saved", f"tensor<{lead}?x{D}x{t}>"))
    if c["saved"] == "residual":
        args.append(("residual", f"tensor<{lead}?x{D // 2}xi8>"))
    if c["grad_lse"]:
        args.append(("dlse", f"tensor<{lead}?xf32>"))
    if c.get("accumulate"):
        # The gradients the sources already have, typed as the sources.
        if c["packed"]:
            args.append(("acc", f"tensor<{L}x?x{D}x{t}>"))
        else:
            args += [(f"acc{l}", f"tensor<?x{D}x{t}>") for l in range(L)]
    return args


def result_types(c):
    types = dict(operand_types(c))
    L = c["L"]
    results = [("dv", types["v"])] if c["packed"] else [
        (f"dv{l}", types[f"v{l}"]) for l in range(L)]
    results.append(("dq", types["q"]))
    if c["key_norm"]:
        results.append(("dg", types["g"]))
    if c["output_norm"]:
        results.append(("dh", types["h"]))
    return results


def module(c):
    args = operand_types(c)
    types = dict(args)
    results = result_types(c)
    if c["packed"]:
        sources = f"packed(%v : {types['v']})"
    else:
        names = ", ".join(f"%v{l}" for l in range(c["L"]))
        sources = f"sources({names} : {types['v0']})"
    parts = [sources, f"query(%q : {types['q']})"]
    for name, keyword in (("g", "key_norm"), ("h", "output_norm"),
                          ("do", "grad"), ("lse", "lse"), ("saved", "saved"),
                          ("residual", "residual"), ("dlse", "grad_lse")):
        if name in types:
            parts.append(f"{keyword}(%{name} : {types[name]})")
    if c.get("accumulate"):
        names = ["acc"] if c["packed"] else [f"acc{l}" for l in range(c["L"])]
        parts.append(f"accumulate({', '.join('%' + n for n in names)} : "
                     f"{', '.join(types[n] for n in names)})")
    signature = ", ".join(f"%{n}: {t}" for n, t in args)
    result_list = ", ".join(t for _, t in results)
    values = ", ".join(f"%{n}" for n, _ in results)
    return (f"func.func @grad({signature})\n    -> ({result_list}) {{\n"
            f"  {values} = attnres.backward {' '.join(parts)}\n"
            f"      {{scale = {c['scale']:.6e} : f64}}\n"
            f"      -> {result_list}\n"
            f"  return {values} : {result_list}\n}}\n")


def build(args):
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    built = []
    for c in CASES:
        for variant, passes in VARIANTS.items():
            name = f"{c['name']}.{variant}"
            source = out / f"{name}.in.mlir"
            source.write_text(module(c))
            lowered = out / f"{name}.mlir"
            pipeline = (f"--attnres-lower-to-nvvm-pipeline=chip=sm_90 "
                        f"keep-host=1 toolkit={args.toolkit}")
            subprocess.run([args.opt, str(source), *passes.split(),
                            "--llvm-request-c-wrappers", pipeline,
                            "-o", str(lowered)], check=True)
            subprocess.run([f"{args.tools}/mlir-translate", "--mlir-to-llvmir",
                            str(lowered), "-o", str(out / f"{name}.ll")],
                           check=True)
            subprocess.run([f"{args.tools}/llc", "-O2",
                            "-relocation-model=pic", "-filetype=obj",
                            str(out / f"{name}.ll"), "-o",
                            str(out / f"{name}.o")], check=True)
            # The runtime is found where `run` is told (--lib), not here.
            subprocess.run([args.cc, "-shared", str(out / f"{name}.o"),
                            f"-L{args.lib}", "-lAttnResRuntime",
                            "-Wl,--allow-shlib-undefined", "-o",
                            str(out / f"lib{name}.so")], check=True)
            built.append(dict(case=c["name"], variant=variant,
                              library=f"lib{name}.so"))
    (out / "libraries.json").write_text(json.dumps(built, indent=1))
    print(f"host backward: built {len(built)} libraries")
    return 0


# --------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------

def descriptor_type(rank):
    """MLIR's memref descriptor of `rank` dimensions, as a C struct."""
    return type(f"Desc{rank}", (ctypes.Structure,), {"_fields_": [
        ("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p),
        ("offset", ctypes.c_int64), ("sizes", ctypes.c_int64 * rank),
        ("strides", ctypes.c_int64 * rank)]})


def describe(tensor):
    """A descriptor of a dense device tensor (kept alive by the caller)."""
    assert tensor.is_contiguous()
    desc = descriptor_type(tensor.dim())()
    desc.allocated = desc.aligned = tensor.data_ptr()
    desc.offset = 0
    for i, (size, stride) in enumerate(zip(tensor.shape, tensor.stride())):
        desc.sizes[i], desc.strides[i] = size, stride
    return desc


class DeviceArray:
    """A result buffer the library allocated, seen by PyTorch."""

    def __init__(self, desc, dtype_name):
        rank = len(desc.sizes)
        shape = tuple(desc.sizes[i] for i in range(rank))
        strides = tuple(desc.strides[i] for i in range(rank))
        self.itemsize = 2 if dtype_name == "bf16" else 4
        self.__cuda_array_interface__ = dict(
            shape=shape, typestr="<i2" if dtype_name == "bf16" else "<f4",
            strides=tuple(s * self.itemsize for s in strides),
            data=(desc.aligned + desc.offset * self.itemsize, False),
            version=3)


def rank_of(mlir_type):
    return mlir_type.count("x")


def run(args):
    import torch
    sys.path.insert(0, str(HERE.parents[2] / "python"))
    sys.path.insert(0, str(HERE))
    from attnres.reference import (attnres_backward_reference, decode_o_pre,
                                   o_pre_residual)
    from run_cases import Report

    runtime = ctypes.CDLL(str(args.lib / "libAttnResRuntime.so"),
                          mode=ctypes.RTLD_GLOBAL)
    runtime.mgpuMemFree.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    runtime.attnresGpuLastError.restype = ctypes.c_char_p
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    built = json.loads((args.out / "libraries.json").read_text())
    cases = {c["name"]: c for c in CASES}
    passed = 0
    for entry in built:
        c = cases[entry["case"]]
        L, D, R, M, N = c["L"], c["D"], c["R"], c["M"], c["N"]
        T = dtypes[c["dtype"]]
        gen = torch.Generator().manual_seed(zlib.crc32(
            f"{entry['case']}.{entry['variant']}".encode()))

        def randn(*shape, mean=0.0, std=1.0):
            return (torch.randn(*shape, generator=gen, dtype=torch.float64)
                    * std + mean)

        lead = (M,) if M > 1 else ()
        x = dict(v=randn(L, N, D).to(T),
                 q=randn(*lead, R, std=2.0 / math.sqrt(R)).to(T),
                 do=randn(*lead, N, D).to(T))
        if c["key_norm"]:
            x["g"] = randn(R, mean=1.0, std=0.2).to(T)
        if c["output_norm"]:
            x["h"] = randn(*((M,) if c["output_norm"] == "per_query" else ()),
                           D, mean=1.0, std=0.2).to(T)
        if c["grad_lse"]:
            x["dlse"] = randn(*lead, N).float()
        if c.get("accumulate"):
            x["acc"] = randn(L, N, D).to(T)
        # The forward's saved results, as a forward would store them.
        v64 = x["v"].double()
        q64 = x["q"].double().reshape(-1, R)
        g64 = x["g"].double() if "g" in x else None
        a = q64 * g64 if g64 is not None else q64
        t = v64[..., D - R:]
        khat = torch.rsqrt(t.square().mean(-1) + 1e-6)[..., None] * t
        z = c["scale"] * torch.einsum("lnr,mr->mln", khat, a)
        lse64 = torch.logsumexp(z, dim=1)
        opre64 = torch.einsum("mln,lnd->mnd", torch.exp(z - lse64[:, None]),
                              v64)
        x["lse"] = lse64.float().reshape(*lead, N)
        stored = None
        if c["saved"]:
            x["saved"] = opre64.to(T).reshape(*lead, N, D)
            stored = x["saved"].double()
        if c["saved"] == "residual":
            x["residual"] = o_pre_residual(opre64.float(), T).reshape(
                *lead, N, D // 2)
            stored = decode_o_pre(x["saved"], x["residual"]).double()

        def reference(dtype):
            y = {k: t.to(dtype) for k, t in x.items()}
            grads = list(attnres_backward_reference(
                y["v"], y["q"], y["do"], key_norm_weight=y.get("g"),
                output_norm_weight=y.get("h"), scale=c["scale"],
                grad_lse=y.get("dlse"), lse=y["lse"],
                o_pre=stored.to(dtype) if stored is not None else None))
            if "acc" in y:
                grads[0] = grads[0] + y["acc"]
            return grads

        ref64, ref32 = reference(torch.float64), reference(torch.float32)
        device = {k: t.cuda().contiguous() for k, t in x.items()}
        names = [n for n, _ in operand_types(c)]
        if not c["packed"]:
            for l in range(L):
                device[f"v{l}"] = device["v"][l].contiguous()
                if "acc" in device:
                    device[f"acc{l}"] = device["acc"][l].contiguous()
        arguments = [describe(device[n]) for n in names]
        results = result_types(c)
        fields = [(n, descriptor_type(rank_of(t))) for n, t in results]
        Results = type("Results", (ctypes.Structure,), {"_fields_": fields})
        out = Results()
        library = ctypes.CDLL(str(args.out / entry["library"]))
        function = library._mlir_ciface_grad
        function.restype = None
        function(ctypes.byref(out), *[ctypes.byref(a) for a in arguments])
        torch.cuda.synchronize()
        report = Report()
        error = runtime.attnresGpuLastError()
        if error:
            report.failures.append(f"runtime: {error.decode()}")
        got = {}
        arguments_at = {a.allocated for a in arguments}
        for n, t in results:
            kind = "f32" if "xf32>" in t else c["dtype"]
            raw = torch.as_tensor(DeviceArray(getattr(out, n), kind),
                                  device="cuda")
            got[n] = (raw.view(torch.bfloat16) if kind == "bf16" else raw
                      ).clone()
            # A result written in place into an argument's buffer is the
            # caller's (PyTorch's), not the library's to free.
            if getattr(out, n).allocated not in arguments_at:
                runtime.mgpuMemFree(getattr(out, n).allocated, None)
        if c.get("accumulate"):
            # The source gradients are the accumulated ones, in place.
            pairs = [("dv", "acc")] if c["packed"] else [
                (f"dv{l}", f"acc{l}") for l in range(L)]
            for result, argument in pairs:
                if getattr(out, result).aligned != device[argument].data_ptr():
                    report.failures.append(
                        f"{result} is not written in place into {argument}")
        dv = got["dv"] if c["packed"] else torch.stack(
            [got[f"dv{l}"] for l in range(L)])
        storage = c["dtype"]
        report.check("dv", dv, ref64[0], ref32[0], storage)
        report.check("dq", got["dq"], ref64[1], ref32[1], storage)
        if c["key_norm"]:
            report.check("dg", got["dg"], ref64[2], ref32[2], storage)
        if c["output_norm"]:
            report.check("dh", got["dh"], ref64[3], ref32[3], storage)
        ok = not report.failures
        passed += ok
        print(f"{'PASS' if ok else 'FAIL'} {entry['case']} {entry['variant']}"
              f" worst={report.worst:.2e}"
              + ("" if ok else "  " + "; ".join(report.failures)),
              flush=True)
    print(f"host backward: {passed} of {len(built)} passed")
    return 0 if passed == len(built) else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--opt", required=True, help="attnres-opt")
    b.add_argument("--tools", required=True, help="LLVM's tools folder")
    b.add_argument("--cc", required=True)
    b.add_argument("--lib", required=True, type=pathlib.Path,
                   help="the folder of libAttnResRuntime.so")
    b.add_argument("--toolkit", required=True, help="the CUDA toolkit")
    b.add_argument("--out", required=True, type=pathlib.Path)
    r = sub.add_parser("run")
    r.add_argument("--lib", required=True, type=pathlib.Path,
                   help="the folder of libAttnResRuntime.so")
    r.add_argument("--out", required=True, type=pathlib.Path,
                   help="the folder `build` wrote")
    args = parser.parse_args()
    return build(args) if args.command == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
