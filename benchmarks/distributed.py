#!/usr/bin/env python3
"""AttnRes over sources sharded across GPUs (attnres.distributed): checks
the sharded op against the single-GPU op and a float64 reference, then
times it against gathering the sources.

  torchrun --nproc_per_node 2 benchmarks/distributed.py --json out.json

Every rank holds L / world consecutive sources of every shape (the split is
even). Two plans compute the same forward and backward:

* sharded: each rank's partial (FP32 o and lse, attnres.attnres_partial),
  all-gathered and merged (attnres.distributed.sharded_attnres); the
  backward sends each rank its partial's gradient.
* gather: the sources are all-gathered and every rank runs attnres.attnres
  over all L; the backward reduce-scatters the source gradients.

Correctness (--check-shape, small): the sharded output and every gradient
(this rank's sources, the query, both weights summed over the ranks)
against the single-GPU op over the same sources, both against float64.
Timing (--shapes): forward + backward of each plan, the median of
--repeats steps between CUDA events after a barrier, with the bytes each
rank sends (attnres.distributed.link_bytes).

--backend gloo with two ranks on one GPU runs the same code where there is
one GPU; its times are not those of a link between GPUs.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_functional

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

import attnres  # noqa: E402
from attnres.distributed import link_bytes, sharded_attnres  # noqa: E402
from attnres.reference import attnres_reference  # noqa: E402

EPS = 1e-6


def parse_shapes(text):
    return [tuple(int(x) for x in part.split(",")) for part in text.split(";")
            if part]


def problem(L, N, D, device, seed=0, scale=1.0):
    """The whole problem, the same on every rank: sources [L, N, D] bf16,
    query, key-norm and output-norm weights (bf16), an output gradient."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    sources = (torch.randn(L, N, D, generator=gen) * scale).to(
        torch.bfloat16).to(device)
    query = (torch.randn(D, generator=gen) / D ** 0.5).to(
        torch.bfloat16).to(device)
    g = (1 + 0.1 * torch.randn(D, generator=gen)).to(torch.bfloat16).to(
        device)
    h = (1 + 0.1 * torch.randn(D, generator=gen)).to(torch.bfloat16).to(
        device)
    grad = torch.randn(N, D, generator=gen).to(torch.bfloat16).to(device)
    return sources, query, g, h, grad


def my_slice(L, rank, world):
    per = L // world
    return slice(rank * per, (rank + 1) * per)


def sharded_step(local, query, g, h, grad):
    o = sharded_attnres(local, query, key_norm_weight=g,
                        output_norm_weight=h, eps=EPS)
    o.backward(grad)
    return o


def gather_step(local, query, g, h, grad):
    pieces = dist_functional.all_gather(local)
    everything = torch.cat(pieces)
    o = attnres.attnres(everything, query, key_norm_weight=g,
                        output_norm_weight=h, eps=EPS)
    o.backward(grad)
    return o


def leaves(sources, query, g, h, part):
    local = sources[part].clone().requires_grad_()
    return local, query.clone().requires_grad_(), \
        g.clone().requires_grad_(), h.clone().requires_grad_()


def relative(got, ref):
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def check(shape, rank, world, device):
    """Relative errors (Frobenius) of the sharded and the single-GPU op
    against float64, for o and each gradient; parameter gradients summed
    over the ranks."""
    L, N, D = shape
    sources, query, g, h, grad = problem(L, N, D, device, seed=1)
    part = my_slice(L, rank, world)
    # Each rank's loss is <o, grad> / world, so that their sum is the
    # single op's <o, grad>: every gradient is then that of one loss.
    grad_r = (grad.float() / world).to(grad.dtype)
    local, q1, g1, h1 = leaves(sources, query, g, h, part)
    o = sharded_step(local, q1, g1, h1, grad_r)
    params = [q1.grad.float(), g1.grad.float(), h1.grad.float()]
    for tensor in params:
        dist.all_reduce(tensor)
    whole_sources, q2, g2, h2 = (t.clone().requires_grad_()
                                 for t in (sources, query, g, h))
    single = attnres.attnres(whole_sources, q2, key_norm_weight=g2,
                             output_norm_weight=h2, eps=EPS)
    single.backward(grad_r * world)
    v64 = sources.double().cpu().requires_grad_()
    q64, g64, h64 = (t.double().cpu().requires_grad_()
                     for t in (query, g, h))
    o64 = attnres_reference(v64, q64, key_norm_weight=g64,
                            output_norm_weight=h64, eps=EPS)
    o64.backward((grad_r.double() * world).cpu())
    rows = {
        "o": (o, single, o64),
        "d own sources": (local.grad, whole_sources.grad[part],
                          v64.grad[part]),
        "dq": (params[0], q2.grad, q64.grad),
        "dg": (params[1], g2.grad, g64.grad),
        "dh": (params[2], h2.grad, h64.grad),
    }
    return {name: dict(sharded=relative(a, c), single=relative(b, c))
            for name, (a, b, c) in rows.items()}


def time_plan(step, args_of, repeats):
    times = []
    for index in range(repeats + 3):
        args = args_of()
        dist.barrier()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        step(*args)
        end.record()
        end.synchronize()
        if index >= 3:
            times.append(start.elapsed_time(end))
    # The slowest rank's median is the step's time.
    median = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return median.item()


def timing(shape, rank, world, device, repeats):
    L, N, D = shape
    sources, query, g, h, grad = problem(L, N, D, device)
    part = my_slice(L, rank, world)
    result = {}
    for name, step in (("sharded", sharded_step), ("gather", gather_step)):
        result[name + "_ms"] = time_plan(
            step, lambda: leaves(sources, query, g, h, part) + (grad,),
            repeats)
    partials, gathered = link_bytes(N, D, world_size=world,
                                    local_sources=L // world)
    result.update(sent_bytes_sharded=partials, sent_bytes_gather=gathered)
    return result


class _Shape:
    """What the argument checks read of a CUDA tensor, without one."""

    def __init__(self, shape, dtype=torch.bfloat16):
        self.shape, self.dtype = tuple(shape), dtype
        self.device = torch.device("cuda", 0)

    def stride(self):
        return ()

    def data_ptr(self):
        return 0


def keys(shapes, world):
    """The kernel keys both plans use, for --prebuild."""
    from attnres import _checks
    result = set()
    for L, N, D in shapes:
        weight = _Shape((D,))
        for count, partial in ((L // world, True), (L, False)):
            call = _checks.check_attnres(
                _Shape((count, N, D)), weight, weight,
                None if partial else weight, EPS, 1.0, "o_pre")
            result.add(call.spec(partial=partial))
        result.add(f"merge:P={world},D={D},out=bf16,output_norm,"
                   f"eps={EPS!r}")
    return sorted(result)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--shapes", default="32,8192,4096;64,4096,8192")
    parser.add_argument("--check-shape", default="8,512,256")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tolerance", type=float, default=2e-2,
                        help="largest relative error of the sharded op "
                        "against float64 (bf16 storage)")
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--prebuild", type=pathlib.Path,
                        help="compile the bundles both plans need for "
                        "--world ranks into this folder (where the compiler "
                        "is; ATTNRES_BUNDLE_DIR there) and exit")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--target", default="sm_90")
    args = parser.parse_args()
    if args.prebuild:
        needed = keys(parse_shapes(args.shapes) +
                      parse_shapes(args.check_shape), args.world)
        attnres.prebuild(needed, args.target, args.prebuild)
        print(f"{len(needed)} bundles in {args.prebuild / args.target}")
        return 0
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
    shared_gpu = torch.cuda.device_count() < world
    ok = True
    errors = check(parse_shapes(args.check_shape)[0], rank, world, device)
    for name, pair in errors.items():
        # The sharded op rounds like the single one (its partials are FP32):
        # within the tolerance of float64, and no further from it than the
        # single-GPU op is, give or take bf16 rounding.
        fine = pair["sharded"] <= args.tolerance
        ok &= fine
        if rank == 0:
            print(f"check {name:14s} sharded {pair['sharded']:.2e}  single "
                  f"{pair['single']:.2e}  {'ok' if fine else 'FAIL'}",
                  flush=True)
    rows = []
    for shape in parse_shapes(args.shapes):
        if shape[0] % world:
            raise SystemExit(f"L = {shape[0]} does not split evenly over "
                             f"{world} ranks")
        row = dict(L=shape[0], N=shape[1], D=shape[2],
                   **timing(shape, rank, world, device, args.repeats))
        rows.append(row)
        if rank == 0:
            print(f"(L, N, D) = {shape}: sharded {row['sharded_ms']:.3f} ms "
                  f"(sends {row['sent_bytes_sharded'] / 1e6:.1f} MB), gather "
                  f"{row['gather_ms']:.3f} ms (sends "
                  f"{row['sent_bytes_gather'] / 1e6:.1f} MB)", flush=True)
    if rank == 0:
        summary = dict(world=world, backend=args.backend,
                       shared_gpu=shared_gpu,
                       gpu=torch.cuda.get_device_name(device),
                       torch=torch.__version__, check=errors, timings=rows,
                       ok=bool(ok))
        print("PASS" if ok else "FAIL",
              "(one GPU shared by the ranks: the times are not a link's)"
              if shared_gpu else "", flush=True)
        if args.json:
            args.json.write_text(json.dumps(summary, indent=1))
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
