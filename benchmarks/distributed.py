#!/usr/bin/env python3
"""AttnRes over sources sharded across GPUs (attnres.distributed): checks
the sharded op against the single-GPU op and a float64 reference, then
times it against gathering the sources.

  torchrun --standalone --nproc_per_node 2 benchmarks/distributed.py \
      --json out.json

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
one GPU; its times are not those of a link between GPUs. --backend auto (the
default) takes NCCL where every rank has a GPU of its own, else gloo.

--local (one process, one GPU, no process group) times what one rank
computes in each plan: the partial over L / world sources and the merge of
world partials, forward and backward, against the single op over all L; and
the partial's forward and backward alone as fractions of their byte floors
at the copy bandwidth measured in the same run.
"""

import argparse
import json
import pathlib
import statistics
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_functional

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

sys.path.insert(0, str(HERE))

import attnres  # noqa: E402
import common  # noqa: E402
from attnres.distributed import (init_torchrun, link_bytes,  # noqa: E402
                                 merge_rows, sharded_attnres)
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


def local_timing(shape, world, repeats, bandwidth):
    """One GPU: the per-rank computation of the sharded plan against the
    single op, and the partial's kernels against their byte floors."""
    from attnres import ops
    L, N, D = shape
    Lr = L // world
    sources, query, g, h, grad = problem(L, N, D, "cuda")
    mine = sources[:Lr].contiguous()
    with torch.no_grad():
        o, lse = attnres.attnres_partial(mine, query, key_norm_weight=g,
                                         eps=EPS)
    # The partial's kernels alone (the custom ops: [M, N, D] rows).
    q2, o3, lse2 = query.unsqueeze(0), o.unsqueeze(0), lse.unsqueeze(0)
    do, dlse = torch.randn_like(o3), torch.randn_like(lse2)
    forward_ms = common.time_events(
        lambda: ops.partial_op([mine], q2, g, EPS, 1.0), repeats)
    backward_ms = common.time_events(
        lambda: ops.partial_backward_op([mine], q2, g, do, dlse, lse2, o3,
                                        EPS, 1.0), repeats)
    # Bytes: the sources (bf16) once; o (FP32) and lse written, or do, o,
    # lse and dlse read and the source gradients written.
    forward_floor = (Lr * N * D * 2 + N * D * 4 + N * 4) / bandwidth
    backward_floor = (2 * Lr * N * D * 2 + 2 * N * D * 4 + 2 * N * 4) / \
        bandwidth

    def single_step():
        whole.grad = None  # a new gradient, not one added to the last
        out = attnres.attnres(whole, query, key_norm_weight=g,
                              output_norm_weight=h, eps=EPS)
        out.backward(grad)

    def rank_step():
        # What sharded_attnres launches on one rank, less the collectives:
        # the other ranks' partials are stand-ins.
        part_o, part_lse = ops.partial_impl([mine], q2, g, EPS, 1.0)
        out, o_pre, merged_lse = merge_rows(
            torch.stack([part_o[0]] + [o] * (world - 1)),
            torch.stack([part_lse[0]] + [lse] * (world - 1)), h, EPS)
        out.to(torch.bfloat16)
        ops.backward_impl([mine], q2, g, h, grad32,
                          merged_lse.reshape(1, N), o_pre.reshape(1, N, D),
                          None, EPS, 1.0, "o_pre", fp32_output=True)
    whole = sources.clone().requires_grad_()
    grad32 = grad.float().unsqueeze(0)
    # The rank's step piece by piece.
    stacked_o = torch.stack([o] * world)
    stacked_lse = torch.stack([lse] * world)
    out, o_pre, merged_lse = merge_rows(stacked_o, stacked_lse, h, EPS)
    o_pre = o_pre.reshape(1, N, D)
    merged_lse = merged_lse.reshape(1, N)
    pieces = dict(
        merge_ms=common.time_events(
            lambda: merge_rows(stacked_o, stacked_lse, h, EPS)[0].to(
                torch.bfloat16), repeats),
        local_backward_ms=common.time_events(
            lambda: ops.backward_impl([mine], q2, g, h, grad32, merged_lse,
                                      o_pre, None, EPS, 1.0, "o_pre",
                                      fp32_output=True), repeats))
    return dict(
        L=L, N=N, D=D, world=world,
        partial_forward_ms=forward_ms,
        partial_forward_fraction=forward_floor * 1e3 / forward_ms,
        partial_backward_ms=backward_ms,
        partial_backward_fraction=backward_floor * 1e3 / backward_ms,
        single_step_ms=common.time_events(single_step, repeats),
        rank_step_ms=common.time_events(rank_step, repeats), **pieces)


def _Shape(shape, dtype=torch.bfloat16):
    """What the argument checks read of a bf16 CUDA tensor, without one."""
    from attnres._checks import TensorShape
    return TensorShape(shape, dtype)


def keys(shapes, world):
    """The kernel keys both plans use, for --prebuild."""
    from attnres import _checks
    result = set()
    for L, N, D in shapes:
        weight = _Shape((D,))
        def call(count, output_norm):
            return _checks.check_attnres(_Shape((count, N, D)), weight,
                                         weight, output_norm, EPS, 1.0,
                                         "o_pre")
        # The sharded plan: the partial (its forward), the merge, the
        # backward from FP32 o_pre; the gather plan: the whole op.
        result |= {call(L // world, None).spec(partial=True),
                   call(L // world, weight).spec(fp32_output=True),
                   call(L, weight).spec(), f"merge:P={world},D={D},out=f32",
                   f"merge:P={world},D={D},out=f32,output_norm,eps={EPS!r}"}
    return sorted(result)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--local", action="store_true",
                        help="one process: time each rank's computation "
                        "(no communication) against the single op")
    parser.add_argument("--shapes", default="32,8192,4096;64,4096,8192")
    parser.add_argument("--check-shape", default="8,512,256")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tolerance", type=float, default=2e-2,
                        help="largest relative error of the sharded op "
                        "against float64 (bf16 storage)")
    parser.add_argument("--json", type=pathlib.Path)
    common.add_prebuild_arguments(
        parser, "the bundles both plans need for --world ranks")
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    if args.prebuild:
        common.prebuild(args, keys(parse_shapes(args.shapes) +
                                   parse_shapes(args.check_shape), args.world))
        return 0
    if args.local:
        bandwidth = common.copy_bandwidth()
        rows = []
        for shape in parse_shapes(args.shapes):
            row = local_timing(shape, args.world, args.repeats, bandwidth)
            rows.append(row)
            print(f"(L, N, D) = {shape}, {args.world} ranks: partial over "
                  f"{shape[0] // args.world} sources: forward "
                  f"{row['partial_forward_ms']:.3f} ms "
                  f"({row['partial_forward_fraction']:.2f} of its floor), "
                  f"backward {row['partial_backward_ms']:.3f} ms "
                  f"({row['partial_backward_fraction']:.2f}); one rank's "
                  f"step {row['rank_step_ms']:.3f} ms against the single "
                  f"op's {row['single_step_ms']:.3f} ms (merge and norm "
                  f"{row['merge_ms']:.3f}, backward "
                  f"{row['local_backward_ms']:.3f})", flush=True)
        if args.json:
            args.json.write_text(json.dumps(dict(
                copy_bandwidth=bandwidth, rows=rows,
                **common.device_facts()), indent=1))
        return 0
    rank, world, device = init_torchrun(args.backend)
    backend = dist.get_backend()
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
        summary = dict(world=world, backend=backend,
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
