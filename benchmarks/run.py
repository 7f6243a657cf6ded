#!/usr/bin/env python3
"""The attnres benchmark: every shape of common.SHAPES through the PyTorch
op, as a user calls it, against the byte floor of the same run.

For each shape (L, N, D) and variant (save="o_pre" or "lse", without or with
the output norm; bf16, R = D, key norm, list sources, a 1-D query) it times

  forward        the forward kernels (attnres.attnres without autograd),
                 replayed from a CUDA graph
  backward       the backward kernels (attnres::backward on the saved
                 tensors), replayed from a CUDA graph
  backward_accumulate
                 (save="o_pre" only) the accumulating backward, which adds
                 the source gradients into one [L, N, D] buffer (what a
                 residual history's reads run: attnres::backward_into),
                 against its own floor, one more read of each gradient row
  fwd_bwd_graph  forward + backward through autograd, captured in one CUDA
                 graph and replayed
  fwd_bwd_eager  the same called eagerly, back to back as a training loop
                 calls it (common.time_steady: the host runs ahead of the
                 GPU where it is faster)

with inputs rotated among copies where they are smaller than 512 MB, checks
the output and every gradient against a float32 PyTorch reference on the
same bf16 inputs (relative Frobenius error), and measures the host time of a
call on tiny shapes where the GPU is idle (L = 4 and L = 64 list sources,
N = 16, D = 256). Prints a table; writes docs/performance/h200.json (or
--json) and a PNG chart next to it.

  python3 benchmarks/run.py --json docs/performance/h200.json

Needs PyTorch >= 2.4 with a CUDA device, the runtime library
(ATTNRES_LIBRARY_DIR) and the bundles (ATTNRES_BUNDLE_DIR, from
benchmarks/prebuild.py where the compiler is).
"""

import argparse
import json
import math
import pathlib
import statistics
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import common  # noqa: E402
import attnres  # noqa: E402
from attnres import ops  # noqa: E402
from attnres.reference import attnres_reference  # noqa: E402

from common import EPS, HOST_SHAPES, SCALE, TOLERANCE, VARIANTS  # noqa: E402


class Inputs:
    """One set of a call's tensors: L list sources [N, D], the query, the
    weights and an output gradient."""

    def __init__(self, L, N, D, onorm, gen):
        bf16 = torch.bfloat16

        def randn(*shape, mean=0.0, std=1.0):
            return (torch.randn(*shape, generator=gen, device="cuda") * std
                    + mean).to(bf16)
        self.sources = [randn(N, D) for _ in range(L)]
        self.query = randn(D, std=2.0 / math.sqrt(D))
        self.key_norm = randn(D, mean=1.0, std=0.2)
        self.output_norm = randn(D, mean=1.0, std=0.2) if onorm else None
        self.grad = randn(N, D)

    def leaves(self):
        """Fresh leaves that require grad, sharing the storage."""
        sources = [s.detach().requires_grad_() for s in self.sources]
        query = self.query.detach().requires_grad_()
        g = self.key_norm.detach().requires_grad_()
        h = (self.output_norm.detach().requires_grad_()
             if self.output_norm is not None else None)
        return sources, query, g, h


def call(x, sources, query, g, h, save):
    return attnres.attnres(sources, query, key_norm_weight=g,
                           output_norm_weight=h, eps=EPS, scale=SCALE,
                           save=save)


def forward_backward(x, save, leaves=None):
    sources, query, g, h = leaves or x.leaves()
    o = call(x, sources, query, g, h, save)
    wrt = sources + [query, g] + ([h] if h is not None else [])
    grads = torch.autograd.grad(o, wrt, x.grad)
    return o, grads


def reference_errors(x, save, o, grads, chunk=2048):
    """Relative Frobenius errors of o and every gradient against float32
    autograd of the reference on the same bf16 inputs, token chunk by token
    chunk (dq, dg, dh summed over the chunks)."""
    N = x.grad.shape[0]
    L = len(x.sources)
    sq = {k: 0.0 for k in ("o", "dv")}
    norm = {k: 0.0 for k in ("o", "dv")}
    dq = dg = dh = None
    for start in range(0, N, chunk):
        stop = min(N, start + chunk)
        v = [s[start:stop].float().requires_grad_() for s in x.sources]
        q = x.query.float().requires_grad_()
        g = x.key_norm.float().requires_grad_()
        h = (x.output_norm.float().requires_grad_()
             if x.output_norm is not None else None)
        ref = attnres_reference(v, q, key_norm_weight=g, output_norm_weight=h,
                                eps=EPS, scale=SCALE)
        # The reference returns the sources' dtype (float32 here).
        wrt = v + [q, g] + ([h] if h is not None else [])
        rgrads = torch.autograd.grad(ref, wrt, x.grad[start:stop].float())
        sq["o"] += (o[start:stop].double() - ref.double()).square().sum()
        norm["o"] += ref.double().square().sum()
        for i in range(L):
            got = grads[i][start:stop].double()
            sq["dv"] += (got - rgrads[i].double()).square().sum()
            norm["dv"] += rgrads[i].double().square().sum()
        rest = [t.double() for t in rgrads[L:]]
        dq = rest[0] if dq is None else dq + rest[0]
        dg = rest[1] if dg is None else dg + rest[1]
        if h is not None:
            dh = rest[2] if dh is None else dh + rest[2]
    errors = {k: math.sqrt(float(sq[k]) / max(float(norm[k]), 1e-300))
              for k in sq}
    errors["dq"] = common.relative_error(grads[L], dq)
    errors["dg"] = common.relative_error(grads[L + 1], dg)
    if dh is not None:
        errors["dh"] = common.relative_error(grads[L + 2], dh)
    return errors


def input_sets(L, N, D, onorm):
    """The input sets a shape's replays rotate through (the same values in
    every run)."""
    gen = torch.Generator(device="cuda").manual_seed(L * 7919 + N + D)
    copies = common.copies_for(common.backward_bytes(L, N, D))
    return [Inputs(L, N, D, onorm, gen) for _ in range(copies)]


def forward_calls(inputs, save):
    """One forward call (no autograd) on each input set."""
    def forward(x):
        with torch.no_grad():
            call(x, x.sources, x.query, x.key_norm, x.output_norm, save)
    return [lambda x=x: forward(x) for x in inputs]


def measure_shape(L, N, D, variant, bandwidth):
    save = variant.split("+")[0]
    onorm = variant.endswith("+onorm")
    inputs = input_sets(L, N, D, onorm)
    fwd_floor = common.forward_bytes(L, N, D) / bandwidth * 1e3
    bwd_floor = common.backward_bytes(L, N, D) / bandwidth * 1e3
    records = []

    def record(measure, ms, floor):
        records.append(dict(L=L, N=N, D=D, variant=variant, measure=measure,
                            ms=ms, floor_ms=floor, fraction=floor / ms))

    # Correctness first, on a fresh call.
    o, grads = forward_backward(inputs[0], save)
    torch.cuda.synchronize()
    errors = reference_errors(inputs[0], save, o, grads)
    del o, grads

    forwards = forward_calls(inputs, save)
    # The reference above is compute-heavy, and a bandwidth-bound kernel
    # timed right after it runs slower for a while (benchmarks/README.md):
    # the first timing settles the GPU and is not kept.
    common.time_graph(forwards)
    record("forward", common.time_graph(forwards), fwd_floor)

    # The backward kernels alone, on what one forward saved.
    saved = []
    for x in inputs:
        with torch.no_grad():
            q = x.query.unsqueeze(0)
            o, lse, o_pre, residual = ops.forward_op(
                x.sources, q, x.key_norm, x.output_norm, EPS, SCALE, save)
        keep = None if save == "lse" else (o_pre if onorm else o)
        saved.append((q, x.grad.unsqueeze(0), lse, keep,
                      residual if residual.numel() else None))

    def backward(x, s):
        q, grad, lse, keep, residual = s
        ops.backward_op(x.sources, q, x.key_norm, x.output_norm, grad, lse,
                        keep, residual, EPS, SCALE, save)
    record("backward", common.time_graph(
        [lambda x=x, s=s: backward(x, s) for x, s in zip(inputs, saved)]),
        bwd_floor)
    if variant == "o_pre":
        buffers = [torch.zeros((L, N, D), dtype=torch.bfloat16,
                               device="cuda") for _ in inputs]

        def accumulate(x, s, into):
            q, grad, lse, keep, residual = s
            ops.backward_into_op(x.sources, q, x.key_norm, x.output_norm,
                                 grad, lse, keep, residual, EPS, SCALE, save,
                                 into, True)
        record("backward_accumulate", common.time_graph(
            [lambda x=x, s=s, b=b: accumulate(x, s, b)
             for x, s, b in zip(inputs, saved, buffers)]),
            common.backward_accumulate_bytes(L, N, D) / bandwidth * 1e3)
        del buffers
    del saved

    leaves = [x.leaves() for x in inputs]
    record("fwd_bwd_graph", common.time_graph(
        [lambda x=x, lv=lv: forward_backward(x, save, lv)
         for x, lv in zip(inputs, leaves)]), fwd_floor + bwd_floor)

    def eager():
        for x, lv in zip(inputs, leaves):
            forward_backward(x, save, lv)
    record("fwd_bwd_eager",
           common.time_steady(eager, repeats=10) / len(inputs),
           fwd_floor + bwd_floor)
    del inputs, leaves
    torch.cuda.empty_cache()
    return records, errors


class NoWork(torch.autograd.Function):
    """What PyTorch's autograd costs a call with these inputs that launches
    nothing: the floor under any autograd.Function's host time."""

    @staticmethod
    def forward(ctx, query, out, grads, *sources):
        ctx.grads = grads
        ctx.query = query
        return out

    @staticmethod
    def backward(ctx, grad):
        return (ctx.query, None, None, *ctx.grads.unbind(0))


def host_times(repeats=300):
    """Microseconds of host time per call on tiny shapes: the GPU is idle,
    so the calls' wall time is the host's. Also with Python's cyclic garbage
    collector off (measure names ending in _nogc), which shows how much of
    it the collector's passes over PyTorch's objects take."""
    import gc
    records = []
    for L, N, D in HOST_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(L)
        x = Inputs(L, N, D, False, gen)
        leaves = x.leaves()

        def forward():
            with torch.no_grad():
                call(x, x.sources, x.query, x.key_norm, None, "o_pre")

        def both():
            forward_backward(x, "o_pre", leaves)
        sources, query, g, _ = leaves
        out = torch.empty(N, D, device="cuda", dtype=torch.bfloat16)
        grads = torch.empty(L, N, D, device="cuda", dtype=torch.bfloat16)

        def floor():
            y = NoWork.apply(query, out, grads, *sources)
            torch.autograd.grad(y, sources + [query], x.grad)
        for measure, fn, collect in (
                ("host_forward", forward, True),
                ("host_fwd_bwd", both, True),
                ("host_fwd_bwd_autograd_floor", floor, True),
                ("host_forward_nogc", forward, False),
                ("host_fwd_bwd_nogc", both, False)):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            samples = []
            if not collect:
                gc.disable()
            try:
                for _ in range(5):
                    start = time.perf_counter()
                    for _ in range(repeats):
                        fn()
                    torch.cuda.synchronize()
                    samples.append((time.perf_counter() - start) / repeats *
                                   1e6)
            finally:
                gc.enable()
            records.append(dict(L=L, N=N, D=D, measure=measure,
                                us=statistics.median(samples)))
    return records


def profile_host(calls=200):
    """Where the host time of a tiny forward + backward goes."""
    import cProfile
    import pstats
    for L, N, D in HOST_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(L)
        x = Inputs(L, N, D, False, gen)
        leaves = x.leaves()
        for _ in range(20):
            forward_backward(x, "o_pre", leaves)
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            forward_backward(x, "o_pre", leaves)
        torch.cuda.synchronize()
        profiler.disable()
        print(f"--- L={L} N={N} D={D}: {calls} forward + backward calls")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return 0


def chart(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    measures = ["forward", "backward", "fwd_bwd_graph", "fwd_bwd_eager"]
    shapes = [tuple(s) for s in common.SHAPES]
    fig, axes = plt.subplots(len(VARIANTS), 1, figsize=(12, 3.2 *
                                                         len(VARIANTS)),
                             sharex=True)
    width = 0.2
    for ax, variant in zip(axes, VARIANTS):
        for i, measure in enumerate(measures):
            values = []
            for L, N, D in shapes:
                match = [r["fraction"] for r in result["records"]
                         if (r.get("variant"), r["measure"], r["L"], r["N"],
                             r["D"]) == (variant, measure, L, N, D)]
                values.append(match[0] if match else 0.0)
            ax.bar([j + (i - 1.5) * width for j in range(len(shapes))],
                   values, width, label=measure)
        ax.axhline(0.9, color="gray", linestyle="--", linewidth=0.8)
        ax.axhline(0.85, color="gray", linestyle=":", linewidth=0.8)
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("floor / time")
        ax.set_title(f"save={variant.replace('+onorm', '')}"
                     f"{' with output norm' if 'onorm' in variant else ''}")
    axes[0].legend(ncol=4, fontsize=8, loc="lower left")
    axes[-1].set_xticks(range(len(shapes)))
    axes[-1].set_xticklabels([f"L={L}\nN={N}\nD={D}" for L, N, D in shapes],
                             fontsize=8)
    fig.suptitle(f"attnres on {result['gpu']}: fraction of the byte floor "
                 f"(copy {result['copy_tbps']:.2f} TB/s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=pathlib.Path,
                        default=HERE.parent / "docs/performance/h200.json")
    parser.add_argument("--shapes", default="",
                        help="only these shapes, L,N,D;L,N,D...")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--no-chart", action="store_true")
    parser.add_argument("--no-host", action="store_true",
                        help="skip the host-time measures")
    parser.add_argument("--profile-host", action="store_true",
                        help="profile the host side of tiny calls (cProfile) "
                        "and exit")
    args = parser.parse_args()
    if args.profile_host:
        return profile_host()

    shapes = [tuple(s) for s in common.SHAPES]
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split(","))
                  for s in args.shapes.split(";")]
    variants = args.variants.split(",")
    bandwidth = common.copy_bandwidth()
    facts = common.device_facts()
    print(f"{facts['gpu']}, driver {facts['driver']}, torch "
          f"{facts['torch']}; copy {bandwidth / 1e12:.3f} TB/s", flush=True)
    records, checks = [], []
    for L, N, D in shapes:
        for variant in variants:
            rs, errors = measure_shape(L, N, D, variant, bandwidth)
            records += rs
            checks.append(dict(L=L, N=N, D=D, variant=variant,
                               errors=errors))
            line = "  ".join(f"{r['measure']} {r['ms']:.4f} ms "
                             f"{r['fraction']:.3f}" for r in rs)
            worst = max(errors.values())
            print(f"({L}, {N}, {D}) {variant:<12} {line}  worst error "
                  f"{worst:.1e}", flush=True)
    host = [] if args.no_host else host_times()
    records += host
    result = dict(copy_tbps=bandwidth / 1e12, gpu=facts["gpu"],
                  driver=facts["driver"], torch=facts["torch"],
                  compiler=attnres_compiler_version(), records=records,
                  checks=checks)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    if not args.no_chart:
        try:
            chart(result, args.json.with_suffix(".png"))
        except ImportError:
            print("matplotlib is missing: no chart")

    print(f"\ncopy {bandwidth / 1e12:.3f} TB/s; fraction of the byte floor "
          f"(ms in brackets); worst relative gradient error")
    print(f"{'L':>3} {'N':>6} {'D':>5} {'variant':<12} {'forward':>15} "
          f"{'backward':>15} {'fwd+bwd graph':>15} {'fwd+bwd eager':>15} "
          f"{'bwd accumulate':>15} {'error':>8}")
    for c in checks:
        row = {r["measure"]: r for r in records if r.get("variant") ==
               c["variant"] and (r["L"], r["N"], r["D"]) ==
               (c["L"], c["N"], c["D"])}
        cells = [f"{row[m]['fraction']:.3f} ({row[m]['ms']:.3f})"
                 if m in row else "-"
                 for m in ("forward", "backward", "fwd_bwd_graph",
                           "fwd_bwd_eager", "backward_accumulate")]
        print(f"{c['L']:>3} {c['N']:>6} {c['D']:>5} {c['variant']:<12} "
              + " ".join(f"{cell:>15}" for cell in cells)
              + f" {max(c['errors'].values()):>8.1e}")
    for r in host:
        print(f"host {r['measure']:<13} L={r['L']:<3} N={r['N']} D={r['D']}:"
              f" {r['us']:.1f} us")
    # A time of wrong results is no result: NaN fails too.
    wrong = [c for c in checks
             if not all(e <= TOLERANCE for e in c["errors"].values())]
    for c in wrong:
        print(f"WRONG ({c['L']}, {c['N']}, {c['D']}) {c['variant']}: "
              f"errors {c['errors']} (tolerance {TOLERANCE})")
    return 1 if wrong else 0


def attnres_compiler_version():
    """The compiler that built the bundles (their manifests say)."""
    import os
    folder = pathlib.Path(os.environ.get("ATTNRES_BUNDLE_DIR", ""))
    for manifest in folder.glob("*/*/manifest.json"):
        return json.loads(manifest.read_text()).get("compiler", "unknown")
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
