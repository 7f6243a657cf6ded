#!/usr/bin/env python3
"""Writes bundle folders whose manifests break one rule each of what the
runtime reads (include/attnres/Bundle/ManifestSchema.h), from a good
forward + backward bundle:

    hostile_manifests.py GOOD_BUNDLE OUT

Each case is OUT/<number>-<name>/ with the mutated manifest.json and the good
bundle's binary. runtime-limits.test inspects them all: each must be refused
at load with a message naming the field, never accepted to fail at call time.
"""

import copy
import json
import pathlib
import shutil
import sys


def kernel(manifest, role):
    """The kernel the manifest's forward or backward op names for `role`."""
    for op in manifest["ops"]:
        if role in op:
            name = op[role]
            return next(k for k in manifest["kernels"] if k["name"] == name)
    raise KeyError(role)


def op(manifest, kind):
    return next(o for o in manifest["ops"] if o["op"] == kind)


def cases():
    """(name, mutation) pairs; a mutation edits the manifest in place."""

    def op_kind_unknown(m):
        op(m, "forward")["op"] = "sideways"

    def op_kind_missing(m):
        del op(m, "forward")["op"]

    def num_sources_missing(m):
        del op(m, "backward")["num_sources"]

    def value_type_unknown(m):
        op(m, "forward")["value_type"] = "f8"

    def output_norm_per_query_not_boolean(m):
        op(m, "backward")["output_norm_per_query"] = 1

    def role_missing(m):
        del op(m, "forward")["forward_partial"]

    def role_not_a_string(m):
        op(m, "backward")["finalize"] = 7

    def role_mismatch(m):
        forward = op(m, "forward")
        forward["forward_partial"] = forward["merge"]

    def arguments_empty(m):
        kernel(m, "forward")["arguments"] = []

    def arguments_too_many(m):
        # 161,000 arguments (10 MB): this took 8 s to read when parsing was
        # quadratic in an array's length; refused by its count now.
        kernel(m, "forward")["arguments"] = [
            {"name": f"a{i}", "kind": "i64", "type": "i64"}
            for i in range(161000)]

    def argument_kind_unknown(m):
        kernel(m, "forward")["arguments"][0]["kind"] = "texture"

    def argument_type_unknown(m):
        kernel(m, "backward")["arguments"][1]["type"] = "f64"

    def argument_name_unknown(m):
        kernel(m, "forward")["arguments"][1]["name"] = "bias"

    def argument_pointer_as_integer(m):
        kernel(m, "finalize")["arguments"].append(
            {"name": "grad", "kind": "i64", "type": "i64"})

    def argument_twice(m):
        arguments = kernel(m, "merge")["arguments"]
        arguments.append(copy.deepcopy(arguments[0]))

    def grid_symbol_unknown(m):
        kernel(m, "forward")["grid"][0]["symbol"] = "M"

    def grid_symbol_not_supplied(m):
        kernel(m, "forward")["grid"][1]["symbol"] = "B"

    def kernel_twice(m):
        m["kernels"].append(copy.deepcopy(m["kernels"][0]))

    def kernel_role_unknown(m):
        kernel(m, "finalize")["role"] = "epilogue"

    def kernels_too_many(m):
        m["kernels"] = [{}] * 4097

    def ops_too_many(m):
        m["ops"] = [{}] * 1025

    def op_not_an_object(m):
        m["ops"].append([])

    def binaries_none(m):
        m["binaries"] = []

    return [(f.__name__.replace("_", "-"), f) for f in [
        op_kind_unknown, op_kind_missing, num_sources_missing,
        value_type_unknown, output_norm_per_query_not_boolean, role_missing,
        role_not_a_string, role_mismatch, arguments_empty, arguments_too_many,
        argument_kind_unknown, argument_type_unknown, argument_name_unknown,
        argument_pointer_as_integer, argument_twice, grid_symbol_unknown,
        grid_symbol_not_supplied, kernel_twice, kernel_role_unknown,
        kernels_too_many, ops_too_many, op_not_an_object, binaries_none]]


def main():
    good, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    manifest = json.loads((good / "manifest.json").read_text())
    binary = manifest["binaries"][0]["file"]
    for number, (name, mutate) in enumerate(cases(), 1):
        folder = out / f"{number:02d}-{name}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(good / binary, folder / binary)
        mutated = copy.deepcopy(manifest)
        mutate(mutated)
        (folder / "manifest.json").write_text(json.dumps(mutated))


if __name__ == "__main__":
    main()
