#!/usr/bin/env python3
"""Times the forward and backward kernels of compiled bundles through the
runtime library, as fractions of the byte floor (common.py) with the copy
bandwidth measured in the same run, and checks every timed result against a
float32 PyTorch reference.

The bundles come from make_kernel_bundles.py: <folder>/index.json lists, for
each entry, the shape (L, N, D), the kernel options it was compiled with and
its bundle folder. Several entries per shape with different options make a
sweep: the table says which options were fastest.

  python3 benchmarks/kernels.py --bundles build/device/kernels --out $OUT

Needs PyTorch with a CUDA device and ATTNRES_LIBRARY_DIR (or an installed
package) for libAttnResRuntime.so.
"""

import argparse
import itertools
import json
import math
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent /
                       "python"))
import common  # noqa: E402
from attnres.runtime import load  # noqa: E402
from common import TOLERANCE  # noqa: E402


class Problem:
    """Inputs of one shape (several copies, rotated), the outputs, and
    float32 references of a slice of tokens (all tokens for dq)."""

    def __init__(self, L, N, D, seed=0):
        self.L, self.N, self.D = L, N, D
        gen = torch.Generator(device="cuda").manual_seed(seed)
        per_call = common.backward_bytes(L, N, D)
        self.copies = common.copies_for(per_call)
        bf16 = torch.bfloat16

        def randn(*shape, std=1.0):
            return (torch.randn(*shape, generator=gen, device="cuda") *
                    std).to(bf16)
        self.sources = [randn(L, N, D) for _ in range(self.copies)]
        self.query = randn(1, D, std=2.0 / math.sqrt(D))
        # For bundles compiled with a key norm (entry "key_norm").
        self.key_norm = randn(D, std=0.2) + 1.0
        self.dg = [torch.empty(D, dtype=bf16, device="cuda")
                   for _ in range(self.copies)]
        self.grad = [randn(1, N, D) for _ in range(self.copies)]
        self.o = [torch.empty(1, N, D, dtype=bf16, device="cuda")
                  for _ in range(self.copies)]
        self.lse = [torch.empty(1, N, dtype=torch.float32, device="cuda")
                    for _ in range(self.copies)]
        self.dv = [torch.empty(L, N, D, dtype=bf16, device="cuda")
                   for _ in range(self.copies)]
        # o's residual, for bundles compiled with save=o_pre_residual.
        self.residual = [torch.empty(1, N, D // 2, dtype=torch.int8,
                                     device="cuda")
                         for _ in range(self.copies)]
        self.dq = [torch.empty(1, D, dtype=bf16, device="cuda")
                   for _ in range(self.copies)]
        self.tables = [self._table(s) for s in self.sources]
        self.grad_tables = [self._table(d) for d in self.dv]

    @staticmethod
    def _table(packed):
        step = packed.stride(0) * packed.element_size()
        return (torch.arange(packed.shape[0], dtype=torch.int64,
                             device="cuda") * step + packed.data_ptr())

    def reference(self, tokens=2048, key_norm=False):
        """float32 o, lse and dv of the first `tokens` tokens of copy 0, and
        dq over all tokens (from the kernel's own stored o and lse, as the
        backward reads them). With `key_norm`, the query stands for q * g
        (the weight scales the normalized keys, so dv and dq see q * g)."""
        v = self.sources[0][:, :tokens].float()
        q = self.query.float()
        if key_norm:
            q = q * self.key_norm.float()
        D = self.D
        rho = torch.rsqrt(v.square().mean(-1) + 1e-6)              # [L, n]
        z = rho * torch.einsum("lnd,d->ln", v, q[0])
        lse = torch.logsumexp(z, 0)
        p = torch.exp(z - lse)
        o = torch.einsum("ln,lnd->nd", p, v)
        do = self.grad[0][0, :tokens].float()
        delta = (do * self.o[0][0, :tokens].float()).sum(-1)
        dots = torch.einsum("nd,lnd->ln", do, v)
        ds = p * (dots - delta)
        ell = z
        dv = p[..., None] * do + (ds * rho)[..., None] * (
            q[0] - (rho * ell / D)[..., None] * v)
        # dq over every token, in chunks.
        dq = torch.zeros(D, dtype=torch.float32, device="cuda")
        for start in range(0, self.N, 4096):
            vv = self.sources[0][:, start:start + 4096].float()
            rr = torch.rsqrt(vv.square().mean(-1) + 1e-6)
            zz = rr * torch.einsum("lnd,d->ln", vv, q[0])
            pp = torch.exp(zz - self.lse[0][0, start:start + 4096])
            dd = self.grad[0][0, start:start + 4096].float()
            de = (dd * self.o[0][0, start:start + 4096].float()).sum(-1)
            dss = pp * (torch.einsum("nd,lnd->ln", dd, vv) - de)
            dq += torch.einsum("ln,lnd->d", dss * rr, vv)
        if key_norm:  # d/dq of rho <v * g, q>
            dq = dq * self.key_norm.float()
        return dict(o=o, lse=lse, dv=dv, dq=dq, tokens=tokens)


def run_entry(entry, folder, problem, bandwidth, check, references,
              once=False, partitions=(0, 0)):
    """`partitions`: the forward's and the backward's source partitions, 0
    for the runtime's choice."""
    runtime = load(folder / entry["bundle"])
    forward_op, backward_op = runtime.op("forward"), runtime.op("backward")
    L, N, D = problem.L, problem.N, problem.D
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    P = partitions[0] or runtime.forward_partitions(forward_op, N)
    fsize = runtime.forward_workspace_size(forward_op, N, P)
    B = runtime.backward_blocks(backward_op, N)
    BP = partitions[1] or runtime.backward_partitions(backward_op, B)
    bsize = runtime.backward_workspace_size(backward_op, N, B, BP)
    fwork = [torch.empty(max(fsize, 1), dtype=torch.uint8, device="cuda")
             for _ in range(problem.copies)]
    bwork = [torch.empty(bsize, dtype=torch.uint8, device="cuda")
             for _ in range(problem.copies)]

    residual = [r.data_ptr() if forward_op.get("writes_o_pre_residual")
                else 0 for r in problem.residual]
    key_norm = entry.get("key_norm", False)
    g = problem.key_norm.data_ptr() if key_norm else 0

    def forward(i):
        runtime.forward(forward_op, num_tokens=N,
                        sources=problem.tables[i].data_ptr(),
                        query=problem.query.data_ptr(), key_norm=g,
                        o=problem.o[i].data_ptr(),
                        o_pre_residual=residual[i],
                        lse=problem.lse[i].data_ptr(), partitions=P,
                        workspace=fwork[i].data_ptr(), workspace_size=fsize,
                        stream=stream())

    def backward(i):
        runtime.backward(backward_op, num_tokens=N,
                         sources=problem.tables[i].data_ptr(),
                         query=problem.query.data_ptr(),
                         grad=problem.grad[i].data_ptr(),
                         lse=problem.lse[i].data_ptr(),
                         saved=problem.o[i].data_ptr(),
                         saved_residual=residual[i],
                         grad_sources=problem.grad_tables[i].data_ptr(),
                         dq=problem.dq[i].data_ptr(), key_norm=g,
                         dg=problem.dg[i].data_ptr() if key_norm else 0,
                         blocks=B,
                         partitions=BP, workspace=bwork[i].data_ptr(),
                         workspace_size=bsize, stream=stream())

    if once:  # one forward and one backward, for a profiler
        forward(0)
        backward(0)
        torch.cuda.synchronize()
        return dict(L=L, N=N, D=D, options=entry["options"], once=True)
    for o in problem.o:
        o.fill_(float("nan"))
    for dv in problem.dv:
        dv.fill_(float("nan"))
    for i in range(problem.copies):
        forward(i)
    for i in range(problem.copies):
        backward(i)
    torch.cuda.synchronize()
    errors = {}
    if check:
        # The first entry of a shape fixes the reference (its backward reads
        # that entry's stored o; later entries differ from it by rounding).
        if key_norm not in references:
            references[key_norm] = problem.reference(key_norm=key_norm)
        ref = references[key_norm]
        n = ref["tokens"]
        errors["o"] = common.relative_error(problem.o[0][0, :n], ref["o"])
        errors["lse"] = common.relative_error(problem.lse[0][0, :n],
                                              ref["lse"])
        errors["dv"] = common.relative_error(problem.dv[0][:, :n], ref["dv"])
        errors["dq"] = common.relative_error(problem.dq[0][0], ref["dq"])
        errors["unwritten"] = float(
            sum(int(torch.isnan(t).sum()) for t in
                (problem.o[0], problem.dv[0])))
    calls = range(problem.copies)
    forward_ms = common.time_graph([lambda i=i: forward(i) for i in calls])
    backward_ms = common.time_graph([lambda i=i: backward(i) for i in calls])
    fwd_floor = common.forward_bytes(L, N, D) / bandwidth * 1e3
    bwd_floor = common.backward_bytes(L, N, D) / bandwidth * 1e3
    ok = all(v <= TOLERANCE for k, v in errors.items() if k != "unwritten") \
        and errors.get("unwritten", 0) == 0
    return dict(L=L, N=N, D=D, options=entry["options"], P=P, B=B, BP=BP,
                forward_ms=forward_ms, forward_floor_ms=fwd_floor,
                forward_fraction=fwd_floor / forward_ms,
                backward_ms=backward_ms, backward_floor_ms=bwd_floor,
                backward_fraction=bwd_floor / backward_ms,
                errors=errors, ok=ok)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", required=True, type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--filter", default="",
                        help="only entries whose options contain this")
    parser.add_argument("--defaults", action="store_true",
                        help="only the entries with the default options")
    parser.add_argument("--shape", default="",
                        help="only this shape, as L,N,D")
    parser.add_argument("--once", action="store_true",
                        help="run each entry once, untimed (for ncu)")
    parser.add_argument("--partitions", default="0",
                        help="comma-separated source partition counts to "
                        "time each entry with, F or F/B for the forward's "
                        "and the backward's (0: the runtime's choice)")
    args = parser.parse_args()
    partition_sweep = []
    for item in args.partitions.split(","):
        forward, _, backward = item.partition("/")
        partition_sweep.append((int(forward), int(backward or forward)))

    index = json.loads((args.bundles / "index.json").read_text())
    bandwidth = 1.0 if args.once else common.copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.3f} TB/s", flush=True)
    results = []
    start = time.time()
    by_shape = {}
    for entry in index:
        if args.filter not in entry["options"]:
            continue
        if args.defaults and entry["options"]:
            continue
        if args.shape and entry["shape"] != [int(x) for x in
                                             args.shape.split(",")]:
            continue
        by_shape.setdefault(tuple(entry["shape"]), []).append(entry)
    for shape, entries in by_shape.items():
        problem = Problem(*shape)
        references = {}
        for entry, partitions in itertools.product(entries, partition_sweep):
            try:
                r = run_entry(entry, args.bundles, problem, bandwidth,
                              not args.no_check, references, args.once,
                              partitions)
            except Exception as error:  # one bad entry must not stop a sweep
                r = dict(L=shape[0], N=shape[1], D=shape[2],
                         options=entry["options"], ok=False,
                         error=repr(error))
            results.append(r)
            if r.get("once"):
                continue
            if "error" in r:
                print(f"{shape} {entry['options']}: {r['error']}", flush=True)
            else:
                print(f"{shape} {r['options']:<58} P={r['P']:<2} "
                      f"B={r['B']:<4}x{r['BP']:<2} fwd {r['forward_ms']:.4f} "
                      f"ms {r['forward_fraction']:.3f}  bwd "
                      f"{r['backward_ms']:.4f} ms {r['backward_fraction']:.3f}"
                      f"  {'ok' if r['ok'] else 'WRONG ' + str(r['errors'])}",
                      flush=True)
        del problem
        torch.cuda.empty_cache()
    print(f"\n{len(results)} entries in {time.time() - start:.0f} s; best "
          f"per shape (fraction of the floor; copy {bandwidth / 1e12:.3f} "
          f"TB/s):")
    if args.once:
        return 0
    for shape in by_shape:
        mine = [r for r in results if (r["L"], r["N"], r["D"]) == shape
                and r.get("ok")]
        if not mine:
            print(f"{shape}: nothing correct")
            continue
        f = max(mine, key=lambda r: r["forward_fraction"])
        b = max(mine, key=lambda r: r["backward_fraction"])
        print(f"{shape}: fwd {f['forward_fraction']:.3f} [{f['options']}]  "
              f"bwd {b['backward_fraction']:.3f} [{b['options']}]")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        facts = common.device_facts()
        (args.out / "kernels.json").write_text(json.dumps(
            dict(copy_tbps=bandwidth / 1e12, **facts, results=results),
            indent=1))
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
