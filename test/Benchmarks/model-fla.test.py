"""Stands in for FLA's fla.ops.attnres with each API model.fla_op knows,
and without it, and prints what fla_op's op called."""
import pathlib
import sys
import types

root = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(root / "benchmarks"))
sys.path.insert(0, str(root / "python"))
import model  # noqa: E402
import torch  # noqa: E402


def install(fused_attnres):
    package = types.ModuleType("fla.ops.attnres")
    package.fused_attnres = fused_attnres
    sys.modules.update({"fla": types.ModuleType("fla"),
                        "fla.ops": types.ModuleType("fla.ops"),
                        "fla.ops.attnres": package})


def query_first(query, residuals, rms_weight, output_rms_weight=None,
                rms_eps=1e-6, scale=1.0):
    return f"query={query} residuals={residuals} rms_weight={rms_weight}"


def stacked_first(sources, query, key_norm_weight=None):
    return (f"sources={sources} query={query} "
            f"key_norm_weight={key_norm_weight}")


torch.stack = lambda tensors: f"stacked({tensors})"
for name, api in (("query first", query_first),
                  ("stacked first", stacked_first)):
    install(api)
    print(f"{name}: {model.fla_op()(['s0', 's1'], 'q', key_norm_weight='g')}")
for key in ("fla", "fla.ops", "fla.ops.attnres"):
    sys.modules.pop(key)
sys.modules["fla"] = None   # (an import of it raises ModuleNotFoundError)
print(f"without FLA: {model.fla_op()}")
