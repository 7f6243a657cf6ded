#!/usr/bin/env python3
"""The residual history's host cost a read, without a GPU: model.py's tiny
Full stack (its host shape's 64 layers and N = 16; D = 16 by default, so
that the CPU's matrix products cost next to nothing) stepped on CPU
tensors through the history's eager launch path, with attnres.ops's launches replaced by what
they cost the host apart from the driver (their output allocations and one
ctypes call with an argument structure of the runtime's size). Prints the
plain residual stream's step, the history's, and a floor: the same stack
with each read an autograd.Function that only allocates its outputs. On
this CPU the difference per read is the history's Python and autograd's;
a GPU's host adds the driver's launches and CUDA allocations
(benchmarks/host_parts.py --model times those there).

  python3 benchmarks/host_python.py [--dim D] [--profile]

It imports the package of its own tree (../python), not PYTHONPATH's: to
compare two versions of the package, run the script from a copy of each
tree.
"""

import argparse
import ctypes
import pathlib
import sys
import time
import types

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import attnres  # noqa: E402
import model  # noqa: E402
from attnres import nn  # noqa: E402

L, N = model.HOST_SHAPE[:2]
_noop = ctypes.CDLL(None).abs   # a C call that returns at once


class _Args(ctypes.Structure):   # the size of the runtime's BackwardArgs
    _fields_ = [(f"f{i}", ctypes.c_int64) for i in range(17)]


class NullLaunches:
    """attnres.ops's eager path on CPU tensors, launching nothing."""

    def dense(self, tensor):
        return tensor

    def _raw_stream(self, index):
        return 0

    def _packed_pointers(self, packed):
        step = packed.stride(0) * packed.element_size()
        return tuple(packed.data_ptr() + row * step
                     for row in range(packed.shape[0]))

    def _pointer_table(self, pointers, device, packed=None):
        return torch.tensor(pointers, dtype=torch.int64)

    def _packed_table(self, packed):
        return self._pointer_table(self._packed_pointers(packed), None)

    def _weight_signature(self, tensor):
        return None if tensor is None else (tensor.shape, tensor.dtype, -1)

    def _runtime(self, key, device, kernel_options=""):
        return kernel_options

    def _BackwardLaunch(self, kernel_options, N):
        # What the bundle's manifest says of its backward: compiled with
        # write-tags (nn._TAG_KERNEL_OPTIONS), it writes over tagged entries.
        return types.SimpleNamespace(
            skips_null_gradients=True,
            writes_tagged_gradients="write-tags=1" in kernel_options)

    def _Plan(self, call, device, kernel_options=""):
        return types.SimpleNamespace(
            call=call, device=device, keeps_o=True,
            backward=self._BackwardLaunch(kernel_options, call.N),
            out_shape=call.lead + (call.D,), lse_shape=(call.M, call.N))

    def _launch_forward_from(self, plan, table, dtype, query, key_norm,
                             output_norm):
        o = torch.empty(plan.out_shape, dtype=dtype)
        lse = torch.empty(plan.lse_shape)
        _noop(ctypes.byref(_Args()))
        return o, lse, None, None

    def _launch_backward_into(self, plan, launch, table, grad_table, dtype,
                              query, key_norm, output_norm, grad, lse, saved,
                              residual):
        dq = torch.empty(query.shape, dtype=query.dtype)
        dg = torch.empty(key_norm.shape, dtype=key_norm.dtype)
        _noop(ctypes.byref(_Args()))
        return dq, dg, None


class _Floor(torch.autograd.Function):
    """A read that only allocates what the history's does."""

    @staticmethod
    def forward(ctx, token, query, key_norm, row):
        ctx.save_for_backward(query, key_norm)
        return torch.empty_like(row), token.new_empty(0)

    @staticmethod
    def backward(ctx, grad_o, grad_token):
        query, key_norm = ctx.saved_tensors
        return (grad_token, torch.empty_like(query),
                torch.empty_like(key_norm), torch.empty_like(grad_o))


def milliseconds(steps, calls=20, rounds=25):
    """The fastest mean step of each of `steps` (name -> step) over
    `rounds` rounds of `calls` calls, the steps taking turns round by round
    so that a slow spell of the machine slows them alike."""
    for step in steps.values():
        for _ in range(3):
            step()
    times = dict.fromkeys(steps, float("inf"))
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(calls):
                step()
            times[name] = min(times[name], (time.perf_counter() - start)
                              / calls * 1e3)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=25,
                        help="rounds in which the steps take turns")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile 20 history steps")
    args = parser.parse_args()
    D = args.dim
    null = NullLaunches()
    ops = types.ModuleType("attnres.ops")
    for name in dir(null):
        if not name.startswith("__"):
            setattr(ops, name, getattr(null, name))
    sys.modules["attnres.ops"], attnres.ops = ops, ops
    nn._launches_kernels = lambda row: True
    torch.set_num_threads(1)

    m = model.Model(L, N, D, torch.bfloat16, device="cpu")
    history = nn.ResidualHistory(L)

    def floor():
        token, row = m.embedding.new_empty(0), m.embedding
        for i, W in enumerate(m.weights):
            x, token = _Floor.apply(token, m.queries[i], m.key_norms[i], row)
            row = x @ W
        row.backward(m.grad_out)

    plain = m.stepping(lambda: model.plain_step(m))
    on_history = m.stepping(lambda: model.history_step(m, history))
    floor = m.stepping(floor)
    times = milliseconds(dict(plain=plain, history=on_history, floor=floor),
                         rounds=args.rounds)
    for name in ("history", "floor"):
        print(f"(L, N, D) = {(L, N, D)}: {name} {times[name]:.2f} ms, plain "
              f"{times['plain']:.2f} ms: "
              f"{(times[name] - times['plain']) / L * 1e3:.1f} us a read "
              f"above the plain stream")
    if args.profile:
        import cProfile
        import pstats
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20):
            on_history()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
