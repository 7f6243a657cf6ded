"""Prints the names of model.contenders's steps (FLA left out: it is
model-fla.test's)."""
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(root / "benchmarks"))
sys.path.insert(0, str(root / "python"))
import model  # noqa: E402

model.fla_op = lambda: None
for name, options in (
        ("default", dict(graphs=True)),
        ("without torch ops", dict(graphs=True, torch_ops=False)),
        # (--unpaired times the Full history only)
        ("block, unpaired", dict(block=True, unpaired_too=True))):
    found = model.contenders(**options)
    print(f"{name}: " + " | ".join(n for n, _ in found))
