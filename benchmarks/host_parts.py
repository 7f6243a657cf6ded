#!/usr/bin/env python3
"""Where the host time of one attnres call goes, piece by piece.

On the tiny host shapes of common.HOST_SHAPES (the GPU is idle there, so a
call's wall time is the host's), times the whole call as a user makes it and
each step of it on its own, plus two floors that are not attnres's: a
PyTorch kernel launch (torch.add of two tiny tensors) and an
autograd.Function with the same inputs that launches nothing. Prints
microseconds per call (median of 5 rounds).

  python3 benchmarks/host_parts.py [--backward | --engine | --timeline |
                                    --model]

--timeline stamps the host's time line of one eager forward + backward,
segment by segment (the Python before the forward, the forward, the
autograd engine before and after the backward, the backward), at the tiny
shapes and at (8, 8192, 2048), where the GPU takes less time than the host.
"""

import pathlib
import statistics
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import common  # noqa: E402
from attnres import _checks, ops  # noqa: E402
from common import EPS, HOST_SHAPES, SCALE  # noqa: E402
from run import Inputs, NoWork, call, forward_backward  # noqa: E402


def micros(fn, repeats=300, rounds=5):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(samples)


def show(L, pieces):
    for name, fn in pieces:
        print(f"L={L:<3} {name:<42} {micros(fn):8.1f} us", flush=True)


def profile(fn, lines, calls=200):
    """The top `lines` functions by own time over `calls` calls of fn."""
    import cProfile
    import pstats
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(lines)


def with_and_without_gc(L, x, leaves):
    """forward + autograd.grad with Python's garbage collector on and off,
    and how many pointer tables the calls added (each one a cache miss)."""
    import gc
    for collect in (True, False):
        tables = len(ops._tables)
        if not collect:
            gc.disable()
        try:
            us = micros(lambda: forward_backward(x, "o_pre", leaves))
        finally:
            gc.enable()
        print(f"L={L:<3} forward + grad, gc {'on ' if collect else 'off'}"
              f"{'':<24} {us:8.1f} us ({len(ops._tables) - tables} new "
              f"tables)", flush=True)


def parts(L, N, D):
    gen = torch.Generator(device="cuda").manual_seed(L)
    x = Inputs(L, N, D, False, gen)
    leaves = x.leaves()
    sources, query, g, _ = leaves
    flat, q = x.sources, x.query.unsqueeze(0)
    device = q.device
    checked = _checks.check_attnres(x.sources, x.query, x.key_norm, None,
                                    EPS, SCALE, "o_pre")
    runtime = ops._runtime(checked.spec(), device)
    op = runtime.op("forward")
    o, lse, o_pre, residual = ops.forward_impl(flat, q, x.key_norm, None, EPS,
                                               SCALE, "o_pre")
    pointers = tuple(t.data_ptr() for t in flat)
    table = ops._pointer_table(pointers, device)
    stream = ops._stream(device)
    tiny = torch.ones(4, device=device)
    out = torch.empty(N, D, device=device, dtype=torch.bfloat16)
    grads = torch.empty(L, N, D, device=device, dtype=torch.bfloat16)

    def forward_nograd():
        with torch.no_grad():
            call(x, x.sources, x.query, x.key_norm, None, "o_pre")

    def nothing_fwd_bwd():
        y = NoWork.apply(query, out, grads, *sources)
        torch.autograd.grad(y, sources + [query], x.grad)

    def builtin_fwd_bwd():
        y = query * 2.0
        torch.autograd.grad(y, [query], y)

    def forward_grad_mode():
        call(x, sources, query, g, None, "o_pre")

    pieces = [
        ("attnres forward (no grad)", forward_nograd),
        ("attnres forward + autograd.grad",
         lambda: forward_backward(x, "o_pre", leaves)),
        ("check_attnres", lambda: _checks.check_attnres(
            x.sources, x.query, x.key_norm, None, EPS, SCALE, "o_pre")),
        ("forward_impl", lambda: ops.forward_impl(
            flat, q, x.key_norm, None, EPS, SCALE, "o_pre")),
        ("backward_impl", lambda: ops.backward_impl(
            flat, q, x.key_norm, None, x.grad.unsqueeze(0), lse, o,
            residual if residual.numel() else None, EPS, SCALE, "o_pre")),
        ("_call (cached check)", lambda: ops._call(
            flat, q, x.key_norm, None, EPS, SCALE, "o_pre")),
        ("spec + _runtime + op", lambda: ops._runtime(
            checked.spec(), device).op("forward")),
        ("forward_partitions + workspace_size",
         lambda: runtime.forward_workspace_size(
             op, N, runtime.forward_partitions(op, N))),
        ("runtime.forward (ctypes + launch)", lambda: runtime.forward(
            op, num_tokens=N, sources=table.data_ptr(),
            query=q.data_ptr(), key_norm=x.key_norm.data_ptr(),
            o=o.data_ptr(), lse=lse.data_ptr(), partitions=1,
            stream=stream)),
        ("_pointer_table (cached)",
         lambda: ops._pointer_table(pointers, device)),
        ("_eager_key", lambda: ops._eager_key(
            x.sources, x.query, x.key_norm, None, EPS, SCALE, "o_pre")),
        ("_stream", lambda: ops._stream(device)),
        ("3 x torch.empty", lambda: (
            torch.empty((1, N, D), dtype=torch.bfloat16, device=device),
            torch.empty((1, N), dtype=torch.float32, device=device),
            torch.empty((0,), dtype=torch.bfloat16, device=device))),
        ("_dense_all", lambda: ops._dense_all(flat, q, x.key_norm, None)),
        ("floor: torch.add launch", lambda: torch.add(tiny, tiny)),
        ("attnres forward (grad mode, no backward)", forward_grad_mode),
        ("_packed_table", lambda: ops._packed_table(grads)),
        ("_parameter_grads", lambda: ops._parameter_grads(q, x.key_norm,
                                                           None)),
        ("floor: autograd.Function, no work, + grad", nothing_fwd_bwd),
        ("floor: torch.mul + grad", builtin_fwd_bwd),
    ]
    show(L, pieces)


def engine(L, N, D):
    """The autograd engine's share: autograd.grad on a graph kept alive
    (retain_graph), so that only the backward is timed."""
    gen = torch.Generator(device="cuda").manual_seed(L)
    x = Inputs(L, N, D, False, gen)
    sources, query, _, _ = x.leaves()
    out = torch.empty(N, D, device="cuda", dtype=torch.bfloat16)
    grads = torch.empty(L, N, D, device="cuda", dtype=torch.bfloat16)
    wrt = sources + [query]
    nothing = NoWork.apply(query, out, grads, *sources)
    stacked = torch.stack(sources).sum(0)
    pieces = [
        ("Function.apply, no work (forward only)",
         lambda: NoWork.apply(query, out, grads, *sources)),
        ("grad of a Function, no work", lambda: torch.autograd.grad(
            nothing, wrt, x.grad, retain_graph=True)),
        ("grad of stack+sum (C++ nodes)", lambda: torch.autograd.grad(
            stacked, wrt[:-1], x.grad, retain_graph=True)),
        ("grads.unbind(0)", lambda: grads.unbind(0)),
    ]
    show(L, pieces)
    profile(lambda: torch.autograd.grad(nothing, wrt, x.grad,
                                        retain_graph=True), 8)


def backward_parts(L, N, D):
    """The backward of one attnres output, through the engine and not."""
    gen = torch.Generator(device="cuda").manual_seed(L)
    x = Inputs(L, N, D, False, gen)
    sources, query, g, _ = x.leaves()
    wrt = sources + [query, g]
    o = call(x, sources, query, g, None, "o_pre")
    plan = next(p for p in ops._plans.values() if p and
                p.grad_shape == (L, N, D))
    lse = torch.empty(plan.lse_shape, device="cuda")
    # The saved o_pre's 4-bit residual, where the call keeps one.
    residual = torch.empty(plan.residual_shape, dtype=torch.int8,
                           device="cuda") if plan.residual_shape else None
    table = ops._pointer_table(tuple(s.data_ptr() for s in sources),
                               query.device)
    pieces = [
        ("grad of attnres output (retained graph)",
         lambda: torch.autograd.grad(o, wrt, x.grad, retain_graph=True)),
        ("_launch_backward", lambda: ops._launch_backward(
            plan, table, x.sources, x.query, x.key_norm, None, x.grad, lse,
            o.detach(), residual)),
        ("_eager forward (grad mode)",
         lambda: call(x, sources, query, g, None, "o_pre")),
    ]
    show(L, pieces)
    with_and_without_gc(L, x, (sources, query, g, None))
    profile(lambda: torch.autograd.grad(o, wrt, x.grad, retain_graph=True),
            14)


def timeline(L, N, D, calls=120, skip=20):
    """Where one eager forward + autograd.grad spends its host time, segment
    by segment: time stamps at the call, at the entry and exit of the
    autograd.Function's forward and backward, and after autograd.grad
    returns (median, 10th and 90th percentile over the calls)."""
    import gc
    stamps = []

    def stamp(tag):
        stamps.append((tag, time.perf_counter()))
    forward, backward = ops._Eager.forward, ops._Eager.backward

    def stamped_forward(ctx, *args):
        stamp("forward in")
        result = forward(ctx, *args)
        stamp("forward out")
        return result

    def stamped_backward(ctx, *args):
        stamp("backward in")
        result = backward(ctx, *args)
        stamp("backward out")
        return result
    gen = torch.Generator(device="cuda").manual_seed(L)
    x = Inputs(L, N, D, False, gen)
    sources, query, g, _ = x.leaves()
    wrt = sources + [query, g]
    for _ in range(skip):
        forward_backward(x, "o_pre", (sources, query, g, None))
    torch.cuda.synchronize()
    segments = {}
    ops._Eager.forward = staticmethod(stamped_forward)
    ops._Eager.backward = staticmethod(stamped_backward)
    gc.disable()
    try:
        for i in range(calls):
            stamps.clear()
            stamp("call")
            o = call(x, sources, query, g, None, "o_pre")
            stamp("returned")
            grads = torch.autograd.grad(o, wrt, x.grad)
            stamp("grad returned")
            del o, grads
            stamp("freed")
            if i >= skip:
                for (a, ta), (b, tb) in zip(stamps, stamps[1:]):
                    segments.setdefault(f"{a} -> {b}", []).append(
                        (tb - ta) * 1e6)
    finally:
        gc.enable()
        ops._Eager.forward = staticmethod(forward)
        ops._Eager.backward = staticmethod(backward)
    torch.cuda.synchronize()
    for name, values in segments.items():
        values.sort()
        tenth = len(values) // 10
        print(f"L={L:<3} N={N:<5} D={D:<5} {name:<30} "
              f"{statistics.median(values):8.1f} us (p10 "
              f"{values[tenth]:7.1f}, p90 {values[-1 - tenth]:7.1f})",
              flush=True)


def model_step():
    import model
    from attnres.nn import ResidualHistory
    import attnres
    m = model.Model(*model.HOST_SHAPE, torch.bfloat16)
    history = ResidualHistory(m.L)

    plain = m.stepping(lambda: model.plain_step(m))
    on_history = m.stepping(lambda: model.history_step(m, history))
    on_list = m.stepping(lambda: model.list_step(m, attnres.attnres))
    L = m.L

    def show(L, pieces):  # a step is milliseconds: fewer repeats
        for name, fn in pieces:
            print(f"L={L:<3} {name:<42} {micros(fn, repeats=20):8.1f} us",
                  flush=True)
    show(L, [("model step: plain", plain),
             ("model step: history", on_history),
             ("model step: list op", on_list)])
    runtime = ops._native.runtime_lib()
    forward, backward = runtime.attnresForward, runtime.attnresBackward
    try:
        # The launches alone: what the history's Python costs without them.
        runtime.attnresForward = lambda *args: 0
        runtime.attnresBackward = lambda *args: 0
        show(L, [("model step: history, no AttnRes launches", on_history)])
    finally:
        runtime.attnresForward, runtime.attnresBackward = forward, backward
    profile(on_history, 30, calls=20)


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    if "--model" in sys.argv:
        model_step()
        return 0
    if "--timeline" in sys.argv:
        for L, N, D in HOST_SHAPES + [(8, 8192, 2048)]:
            timeline(L, N, D)
        return 0
    if "--backward" in sys.argv:
        for L, N, D in HOST_SHAPES:
            backward_parts(L, N, D)
        return 0
    if "--engine" in sys.argv:
        for L, N, D in HOST_SHAPES:
            engine(L, N, D)
        return 0
    for L, N, D in HOST_SHAPES:
        parts(L, N, D)
    return 0


if __name__ == "__main__":
    sys.exit(main())
