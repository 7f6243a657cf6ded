"""Where the PyTorch ops get their kernels.

Each op call maps to a *key*: a compiler spec for attnres forward/backward
(``train:L=8,D=1024,...``, docs/Bundle.md), or ``merge:...`` / ``sum:...``
for partition_reduce, which this module turns into MLIR text. A key and a
target name one bundle folder, found in this order:

1. ``$ATTNRES_BUNDLE_DIR/<target>/<name>/``: prebuilt bundles (see
   :func:`prebuild`), for machines without LLVM/MLIR;
2. the disk cache ``$ATTNRES_CACHE_DIR`` (default ``~/.cache/attnres``),
   under ``<compiler version>-<fingerprint>/<target>/<name>/`` (the
   fingerprint: of the compiler library's file, so that a rebuilt compiler
   never loads an older build's kernels), compiled on first use when the
   compiler library is present.

A key compiled with kernel options (convert-attnres-to-gpu's choices, as
the residual history's paired reads ask for their two-query pass) is a
bundle of its own: its name has ``+NAME=VALUE`` for each option.
"""

import os
import pathlib
import re
import struct

from . import _native
from .errors import BundleError, InvalidArgumentError

_SPEC_KINDS = ("forward", "backward", "train")


def bundle_name(key, kernel_options=""):
    """A file name for `key`, readable and one-to-one for the keys made
    here (':' and ',' never occur in their values); a bundle compiled with
    `kernel_options` (convert-attnres-to-gpu options, space-separated
    name=value items) has them after a '+' each."""
    name = key.replace(":", "__").replace(",", "_")
    name += "".join("+" + item for item in kernel_options.split())
    if not re.fullmatch(r"[A-Za-z0-9_.=+\-]+", name):
        raise InvalidArgumentError(
            f"cannot name a bundle for key {key!r} with kernel options "
            f"{kernel_options!r}")
    return name


# The order the PyTorch ops write a key's items in (_checks.Call.spec,
# ops._merge_key). The compiler takes them in any order, but a bundle's
# folder is named after its key, so prebuild stores a key under this order,
# where the ops will look for it.
_ITEM_ORDER = {
    "spec": ("L", "D", "R", "M", "dtype", "multi_query", "accumulate",
             "output_dtype", "grad_lse", "param_dtype", "key_norm",
             "output_norm", "save", "eps", "scale"),
    "merge": ("P", "D", "out", "sink", "output_norm", "eps"),
    "sum": ("P",),
}


def canonical_key(key):
    """`key` with its items in the order the PyTorch ops write them; a key
    with an item not known here, or one twice, is returned as given (the
    compiler will name what is wrong with it)."""
    kind, colon, rest = key.partition(":")
    order = _ITEM_ORDER.get("spec" if kind in _SPEC_KINDS else kind)
    parts = [part for part in rest.split(",") if part]
    names = [part.partition("=")[0] for part in parts]
    if not colon or order is None or len(set(names)) != len(names) or \
            not set(names) <= set(order):
        return key
    parts.sort(key=lambda part: order.index(part.partition("=")[0]))
    return f"{kind}:{','.join(parts)}"


def _items(key):
    kind, _, rest = key.partition(":")
    items = {}
    for part in filter(None, rest.split(",")):
        name, _, value = part.partition("=")
        items[name] = value
    return kind, items


def module_for_key(key):
    """MLIR text for a merge:/sum: key (None for a compiler spec)."""
    kind, items = _items(key)
    if kind in _SPEC_KINDS:
        return None
    try:
        return _module(kind, items)
    except (KeyError, ValueError):
        raise InvalidArgumentError(
            f"bad kernel key {key!r}: expected sum:P=<n> or merge:P=<n>,"
            f"D=<n>,out=<f32|bf16|f16>[,sink][,output_norm,eps=<x>]"
        ) from None


def _module(kind, items):
    P = int(items["P"])
    if kind == "sum":
        return (f"func.func @sum(%p: tensor<{P}x?xf32>) -> tensor<?xf32> {{\n"
                f"  %s = attnres.partition_reduce sum %p : tensor<{P}x?xf32>"
                f" -> tensor<?xf32>\n  return %s : tensor<?xf32>\n}}\n")
    if kind != "merge":
        raise KeyError(kind)
    D, out = int(items["D"]), items["out"]
    if out not in ("f32", "bf16", "f16"):
        raise ValueError(out)
    args = [f"%p: tensor<{P}x?x{D}xf32>", f"%l: tensor<{P}x?xf32>"]
    operands = f"%p : tensor<{P}x?x{D}xf32> lse(%l : tensor<{P}x?xf32>)"
    results = [f"tensor<?x{D}x{out}>", "tensor<?xf32>"]
    if "sink" in items:
        args.append("%s: tensor<?xf32>")
        operands += " sink(%s : tensor<?xf32>)"
    if "output_norm" in items:
        args.append(f"%h: tensor<{D}x{out}>")
        operands += f" output_norm(%h : tensor<{D}x{out}>)"
        results.append(f"tensor<?x{D}x{out}>")
    attrs = ""
    if "output_norm" in items:
        # The exact f64 bit pattern, as the compiler's spec parser writes it.
        bits = struct.unpack("<Q", struct.pack("<d", float(items["eps"])))[0]
        attrs = f" {{eps = 0x{bits:016X} : f64}}"
    names = ", ".join(f"%r#{i}" for i in range(len(results)))
    return (f"func.func @merge({', '.join(args)}) -> ({', '.join(results)}) "
            f"{{\n  %r:{len(results)} = attnres.partition_reduce softmax "
            f"{operands}{attrs} -> {', '.join(results)}\n"
            f"  return {names} : {', '.join(results)}\n}}\n")


def cache_dir():
    return pathlib.Path(os.environ.get("ATTNRES_CACHE_DIR") or
                        pathlib.Path.home() / ".cache" / "attnres")


def compiled_cache_dir():
    """The disk cache's folder for the loaded compiler: its version and
    the fingerprint of its library, so that a rebuilt compiler (whose
    version string may not have changed) compiles its bundles anew instead
    of loading ones an older build made."""
    from .compiler import compiler_version
    version = re.sub(r"[^A-Za-z0-9.]+", "-", compiler_version()).strip("-")
    return cache_dir() / f"{version}-{_native.compiler_fingerprint()}"


def prebuilt_dir():
    folder = os.environ.get("ATTNRES_BUNDLE_DIR")
    return pathlib.Path(folder) if folder else None


def compile_key(key, target, output, kernel_options=""):
    """Compiles `key` for `target` into the folder `output`."""
    from .compiler import compile as compile_bundle
    module = module_for_key(key)
    if module is None:
        return compile_bundle(key, target=target, output=output,
                              kernel_options=kernel_options)
    return compile_bundle(module=module, target=target, output=output,
                          kernel_options=kernel_options)


def folder_for(key, target, kernel_options=""):
    """The bundle folder of `key` for `target` (compiled with
    `kernel_options`): prebuilt, cached, or compiled now into the cache."""
    name = bundle_name(key, kernel_options)
    prebuilt = prebuilt_dir()
    if prebuilt is not None:
        folder = prebuilt / target / name
        if (folder / "manifest.json").is_file():
            return folder
    if not _native.compiler_available():
        where = f"{prebuilt / target / name}" if prebuilt else \
            "ATTNRES_BUNDLE_DIR (not set)"
        options = f" --kernel-options '{kernel_options}'" \
            if kernel_options else ""
        compiled = f" (compiled with {kernel_options})" \
            if kernel_options else ""
        raise BundleError(
            f"no kernels for {key}{compiled} on {target}: no prebuilt "
            f"bundle in "
            f"{where}, and the attnres compiler library (which needs "
            f"LLVM/MLIR 22) is not available to compile one. Prebuild on a "
            f"machine with the compiler: python -m attnres prebuild "
            f"--target {target} --output DIR{options} '{key}'")
    folder = compiled_cache_dir() / target / name
    if not (folder / "manifest.json").is_file():
        compile_key(key, target, folder, kernel_options)
    return folder


def prebuild(keys, target, output, kernel_options=""):
    """Compiles every key for `target` into ``output/<target>/<name>/``, the
    layout ATTNRES_BUNDLE_DIR expects, each named after its canonical key
    (canonical_key) and `kernel_options`. A key may also be a pair (key,
    kernel options of its own). Returns the folders."""
    folders = []
    for item in keys:
        key, options = item if isinstance(item, tuple) else \
            (item, kernel_options)
        key = canonical_key(key)
        folder = pathlib.Path(output) / target / bundle_name(key, options)
        if not (folder / "manifest.json").is_file():
            compile_key(key, target, folder, options)
        folders.append(folder)
    return folders
