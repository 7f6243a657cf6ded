"""Drives model.timed_in_rounds with steps that report made-up times (one
per turn) in place of CUDA events, and prints the order of the turns and
what it made of them."""
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(root / "benchmarks"))
sys.path.insert(0, str(root / "python"))
import model  # noqa: E402
import torch  # noqa: E402

order = []
made_up = {"plain": iter([10.0, 14.0, 18.0]),
           "history": iter([15.0, 16.0, 24.0]),
           "ops": iter([400.0]),
           "plain, CUDA graph": iter([1.0, 1.5, 1.0]),
           "history, CUDA graph": iter([3.0, 3.0, 3.5])}


class OutOfMemory(Exception):
    pass


def step_of(name):
    def step():
        order.append(name)
        try:
            return next(made_up[name])
        except StopIteration:   # (the ops' second turn)
            raise OutOfMemory from None
    return step


class Stack:
    """Stands in for model.Model: stepping(run) is the step itself."""

    @staticmethod
    def stepping(run):
        return run


model.common.time_steady = lambda fn, repeats, warmup: fn()
torch.OutOfMemoryError = OutOfMemory   # (what timed_in_rounds catches)
model.release = lambda stack: order.append("(released)")
alone = []
found = model.timed_in_rounds(
    Stack(), {name: step_of(name) for name in (
        "plain", "history", "ops", "plain, CUDA graph",
        "history, CUDA graph")}, rounds=3, repeats=5, out_of_memory=alone)
print("turns: " + " ".join(order))
print(f"out of memory: {alone}")
for name, (ms, share, turns) in found.items():
    print(f"{name}: {ms:.1f} ms, share {share:.1f} ms, turns {turns}")
