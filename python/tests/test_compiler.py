"""The compiler and runtime through ctypes, without a GPU: compiling specs
and modules, bundle folders, launch rules, the kernel store (prebuilt folder,
disk cache, no compiler) and the errors of each."""

import ctypes
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

import attnres
from attnres import _native, kernels

def _has_cuda_driver():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


needs_ptxas = pytest.mark.skipif(
    not shutil.which("ptxas") and not os.path.exists(
        "/usr/local/cuda/bin/ptxas"),
    reason="NVIDIA bundles need ptxas (CUDA toolkit)")


@pytest.fixture(scope="module")
def train_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundles") / "train"
    attnres.compile("train:L=64,D=1024,M=2,dtype=bf16,key_norm,output_norm",
                    target="sm_90", output=folder)
    return folder


@needs_ptxas
def test_compile_writes_a_bundle(train_bundle):
    manifest = json.loads((train_bundle / "manifest.json").read_text())
    assert manifest["target"]["chip"] == "sm_90"
    assert [op["op"] for op in manifest["ops"]] == ["forward", "backward"]
    binary = train_bundle / manifest["binaries"][0]["file"]
    assert binary.read_bytes()[:4] == b"\x7fELF"
    assert attnres.compiler_version().startswith("attnres ")
    # sm_90 has thread-block clusters: the forward also gets the kernel that
    # merges a row's partitions in the cluster of its blocks (grid N x P,
    # clusters along y); an inspected bundle's rules ignore it (above).
    kernels_by_name = {k["name"]: k for k in manifest["kernels"]}
    cluster = kernels_by_name[manifest["ops"][0]["forward_cluster"]]
    assert cluster["role"] == "forward_cluster" and cluster["cluster_y"]
    assert [g["symbol"] for g in cluster["grid"]] == ["N", "P", "1"]
    assert not any(k.get("cluster_y") for k in manifest["kernels"]
                   if k is not cluster)


@needs_ptxas
def test_no_clusters_before_sm_90(tmp_path):
    attnres.compile("forward:L=8,D=1024", target="sm_80", output=tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert "forward_cluster" not in manifest["ops"][0]
    assert not any(k.get("cluster_y") for k in manifest["kernels"])


@needs_ptxas
def test_inspect_follows_the_manifest_rules(train_bundle, monkeypatch):
    monkeypatch.setenv("ATTNRES_NUM_MULTIPROCESSORS", "132")
    runtime = attnres.inspect(train_bundle)
    forward, backward = runtime.op("forward"), runtime.op("backward")
    L, D, M = 64, 1024, 2
    for tokens in (1, 7, 100, 5000):
        # docs/Bundle.md: P = max(1, min(floor(2 SMs / ceil(N / G)), L / 4,
        # L D bytes / 32 KiB)), with FP32 partial o and lse, 256-aligned.
        G = forward["rows_per_block"]
        P = max(1, min(264 // math.ceil(tokens / G), L // 4,
                       L * D * 2 // 32768))
        assert runtime.forward_partitions(forward, tokens) == P
        align = lambda n: (n + 255) // 256 * 256  # noqa: E731
        expected = 0 if P == 1 else \
            align(P * M * tokens * D * 4) + align(P * M * tokens * 4)
        assert runtime.forward_workspace_size(forward, tokens) == expected
        # Token blocks of at least one group of rows, up to two blocks per
        # multiprocessor (an inspected bundle has no occupancy), and the
        # sources split to fill the rest.
        G = backward["rows_per_block"]
        B = max(1, min(264, math.ceil(tokens / G)))
        assert runtime.backward_blocks(backward, tokens) == B
        BP = max(1, min(264 // B, L // 4))
        assert runtime.backward_partitions(backward, B) == BP
        # One partial row a block: its row groups add theirs first.
        assert backward["partial_rows_per_block"] == 1
        rows = BP * B
        assert runtime.backward_workspace_size(backward, tokens) == \
            align(rows * M * D * 4) + align(rows * 1 * D * 4)


@needs_ptxas
def test_runtime_misuse_is_reported(train_bundle):
    runtime = attnres.inspect(train_bundle)
    with pytest.raises(attnres.InvalidArgumentError,
                       match="inspected, not loaded"):
        runtime.forward(0, num_tokens=4, sources=1 << 20, query=1 << 20,
                        o=1 << 20, lse=1 << 20, partitions=1)
    with pytest.raises(attnres.InvalidArgumentError,
                       match="op 1 is a backward, not a forward"):
        runtime.forward(1, num_tokens=4, sources=0, query=0, o=0, lse=0)
    with pytest.raises(attnres.InvalidArgumentError,
                       match="partitions must be in"):
        runtime.forward(0, num_tokens=4, sources=0, query=0, o=0, lse=0,
                        partitions=65)
    with pytest.raises(attnres.InvalidArgumentError,
                       match="has no partition_reduce_sum op"):
        runtime.op("partition_reduce_sum")


def test_bad_bundles(tmp_path):
    with pytest.raises(attnres.BundleError, match="cannot read"):
        attnres.inspect(tmp_path / "missing")
    (tmp_path / "manifest.json").write_text('{"format_version": 1')
    with pytest.raises(attnres.BundleError, match="malformed bundle manifest"):
        attnres.inspect(tmp_path)
    with pytest.raises(attnres.InvalidArgumentError, match="str or Path"):
        attnres.inspect(42)


# A kernel argument the runtime reads, for manifests that fail elsewhere.
ARG = '{"name": "output", "kind": "buffer", "type": "f32"}'


@pytest.mark.parametrize("manifest, message", [
    ("[]", "format_version 1 expected"),
    ('{"format_version": 1, "target": {"vendor": "tpu"}}',
     "target.vendor must be nvidia or amd"),
    ('{"format_version": 1, "target": {"vendor": "amd"}, "kernels": [3]}',
     "a kernel lacks name, role, arguments, grid or block"),
    ('{"format_version": 1, "target": {"vendor": "amd"}, "kernels": [{"name":'
     ' "k", "role": "sum", "block": 64, "arguments": [7], "grid": [{}, {}, '
     '{}]}]}', "kernel k has an argument without name or kind"),
    ('{"format_version": 1, "target": {"vendor": "amd"}, "kernels": [{"name":'
     ' "k", "role": "sum", "block": 64, "arguments": [' + ARG + '], "grid": '
     '[{"symbol": '
     '"N", "scale": 1, "divisor": 0}, {}, {}]}]}',
     "kernel k has a bad grid rule"),
    # Numbers the launches compute with: whole, in range, never cast from a
    # fraction or an overflowing double (a vector_width of 0 divided by
    # zero at the first launch).
    *[('{"format_version": 1, "target": {"vendor": "amd"}, "kernels": '
       '[{"name": "k", "role": "sum", "arguments": [' + ARG + '], "grid": '
       '[{"symbol": '
       f'"N", "scale": {scale}, "divisor": {divisor}}}, {{}}, {{}}], '
       f'"block": {block}, "vector_width": {width}}}]}}', message)
      for block, width, scale, divisor, message in [
          (0, 8, 1, 1, "kernel k: block must be a whole number in [1, 1024]"),
          ("1e400", 8, 1, 1, "number overflow parsing"),
          (64.5, 8, 1, 1, "kernel k: block must be a whole number"),
          (64, 0, 1, 1, "kernel k: vector_width must be a whole number in "
                        "[1, 64]"),
          ('"8"', 8, 1, 1, "kernel k: block must be a whole number"),
          (64, 8, "1e300", 1, "kernel k has a bad grid rule"),
          (64, 8, 1, 0.5, "kernel k has a bad grid rule")]],
    # An argument's alignment: a power of two in [1, 256].
    *[('{"format_version": 1, "target": {"vendor": "amd"}, "kernels": [{'
       '"name": "k", "role": "sum", "block": 64, "grid": [{"symbol": "1", '
       '"scale": 1, "divisor": 1}, {"symbol": "1", "scale": 1, "divisor": 1},'
       ' {"symbol": "1", "scale": 1, "divisor": 1}], "arguments": [{"name": '
       f'"o", "kind": "buffer", "type": "f32", "alignment": {alignment}}}]}}]}}',
       "kernel k: argument o has an alignment that is not a power of two in "
       "[1, 256]")
      for alignment in (3, 0, 512, 1.5, '"16"')],
    # cluster_y (the grid's y blocks form one cluster) is a boolean.
    *[('{"format_version": 1, "target": {"vendor": "nvidia"}, "kernels": [{'
       '"name": "k", "role": "forward_cluster", "block": 64, "grid": [{'
       '"symbol": "N", "scale": 1, "divisor": 1}, {"symbol": "P", "scale": 1,'
       ' "divisor": 1}, {"symbol": "1", "scale": 1, "divisor": 1}], '
       f'"arguments": [{ARG}], "cluster_y": {value}}}]}}',
       "kernel k: cluster_y must be true or false")
      for value in (1, '"true"', "null")],
    ('{"format_version": 1, "target": {"vendor": "amd"}, "kernels": [], '
     '"ops": [{"op": "forward", "width": -1}]}',
     "op fact width must be a whole number in [1, 65536]"),
    ('{"format_version": 1, "target": {"vendor": "amd"}, "kernels": [], '
     '"ops": [{"op": "forward", "num_queries": 1e18}]}',
     "op fact num_queries must be a whole number in [1, 16]"),
    ('{"format_version": 1, "target": {"vendor": "amd"}, "kernels": [], '
     '"ops": [], "rules": {"launch": {"blocks_per_multiprocessor": 1e30}}}',
     "rules.launch.blocks_per_multiprocessor must be a whole number"),
    ('{"format_version": 1, "target": {"vendor": "amd"}, "kernels": [], '
     '"ops": [{"op": "partition_reduce_sum", "sum": "missing"}]}',
     "op 0 (partition_reduce_sum) names kernel 'missing' as its sum, which "
     "the bundle lacks"),
    ('{"format_version": 1, "target": {"vendor": "amd"}, "kernels": []}',
     "no ops array"),
])
def test_malformed_manifests(tmp_path, manifest, message):
    (tmp_path / "manifest.json").write_text(manifest)
    with pytest.raises(attnres.BundleError) as raised:
        attnres.inspect(tmp_path)
    assert message in str(raised.value)


@pytest.mark.parametrize("manifest, message", [
    # Numbers as JSON spells them, finite.
    (b'{"format_version": -inf}', "invalid number"),
    (b'{"format_version": -nan}', "invalid number"),
    (b'{"format_version": 1e400}', "number overflow parsing '1e400'"),
    (b'{"format_version": 0x1}', "malformed bundle manifest"),
    (b'{"format_version": 01}', "malformed bundle manifest"),
    (b'{"format_version": 1.}', "invalid number"),
    # Strings: escapes with four hex digits, surrogates in pairs, no raw
    # control characters, well-formed UTF-8.
    (b'{"a": "\\uZZZZ"}', "'\\u' must be followed by 4 hex digits"),
    (b'{"a": "\\u12G4"}', "'\\u' must be followed by 4 hex digits"),
    (b'{"a": "\\ud800"}',
     "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"),
    (b'{"a": "\\udc00"}', "surrogate U+DC00..U+DFFF must follow U+D800"),
    (b'{"a": "x\x01"}', "control character U+0001 (SOH) must be escaped"),
    # The parser quotes what it read: bytes that are not printable ASCII
    # come back as \xNN, so that the message is text.
    (b'{"a": "\xff"}', "ill-formed UTF-8 byte; last read: '\"\\xff'"),
    (b'{"a": "\xc0\xaf"}', "ill-formed UTF-8 byte"),   # overlong
    (b'{"a": "\xed\xa0\x80"}', "ill-formed UTF-8 byte"),  # surrogate
    (b'{"a": "\xf4\x90\x80\x80"}', "ill-formed UTF-8 byte"),
    # Nesting has a limit, numbers past int64 are refused where whole
    # numbers are expected.
    (b'[' * 65 + b']' * 65, "nesting deeper than 64"),
    (b'{"format_version": 1, "target": {"vendor": "amd"}, "kernels": [], '
     b'"ops": [{"op": "partition_reduce_sum", '
     b'"width": 18446744073709551616}]}',
     "op fact width must be a whole number in [1, 65536]"),
])
def test_malformed_json(tmp_path, manifest, message):
    (tmp_path / "manifest.json").write_bytes(manifest)
    with pytest.raises(attnres.BundleError) as raised:
        attnres.inspect(tmp_path)
    assert message in str(raised.value)


def test_nesting_up_to_the_limit_parses(tmp_path):
    # 64 levels are JSON the runtime reads: the manifest then fails on its
    # content, not its syntax.
    (tmp_path / "manifest.json").write_bytes(b"[" * 64 + b"]" * 64)
    with pytest.raises(attnres.BundleError, match="format_version 1"):
        attnres.inspect(tmp_path)


def test_well_formed_json_strings_parse(tmp_path):
    # UTF-8, a surrogate pair and escapes are fine: the manifest then fails
    # on its content (format_version), not on its syntax.
    (tmp_path / "manifest.json").write_bytes(
        b'{"x": "\xc3\xa9\xf0\x9f\x98\x80 \\ud83d\\ude00 \\n\\u00e9",'
        b' "format_version": 2}')
    with pytest.raises(attnres.BundleError, match="format_version 1"):
        attnres.inspect(tmp_path)


@needs_ptxas
@pytest.mark.skipif(_has_cuda_driver(), reason="this machine has the driver")
def test_load_without_a_driver(train_bundle):
    with pytest.raises(attnres.NoDriverError,
                       match="cannot load the CUDA driver"):
        attnres.load(train_bundle)
    # From memory: the manifest is parsed, then the driver is missing.
    compiled = attnres.compile("forward:L=2,D=64", target="sm_90")
    with pytest.raises(attnres.NoDriverError,
                       match="cannot load the CUDA driver"):
        attnres.load(compiled)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(spec="train:L=4,D=64,R=65"), attnres.CompileError,
     "spec item R=65 is out of range [1, 64] (R <= D)"),
    (dict(spec="train:L=100000000,D=64"), attnres.CompileError,
     "spec item L=100000000 is out of range [1, 4096]"),
    (dict(spec="train:L=4,D=64,eps=-1"), attnres.CompileError,
     "eps must be finite and > 0"),
    (dict(spec="train:L=4,D=64,bogus"), attnres.CompileError,
     "unknown spec item 'bogus'"),
    (dict(spec="train:L=4,D=64", target="sm_1000x"), attnres.CompileError,
     "unknown target 'sm_1000x'"),
    (dict(spec="train:L=4,D=64", target="tpu"), attnres.CompileError,
     "unknown target 'tpu'"),
    (dict(spec="train:L=4,D=64", format="elf"),
     attnres.InvalidArgumentError, "format must be 'bin', 'isa' or"),
    (dict(spec="train:L=4,D=64", opt_level=9),
     attnres.InvalidArgumentError, "opt_level must be an int in [0, 3]"),
    (dict(module="func.func @f() {"), attnres.CompileError,
     "attnres-input:1:"),
    (dict(), attnres.InvalidArgumentError, "exactly one of spec and module"),
])
def test_compile_errors(kwargs, error, message):
    with pytest.raises(error) as raised:
        attnres.compile(**kwargs)
    assert message in str(raised.value)


def test_compile_a_module_to_amd_isa():
    bundle = attnres.compile(
        module=kernels.module_for_key("merge:P=3,D=64,out=f16,sink"),
        target="gfx942", format="isa")
    (name, text), = bundle.files.items()
    assert name.endswith(".gfx942.s")
    assert b"merge_0_merge" in text  # @merge's op 0, role merge
    assert bundle.manifest["ops"][0]["op"] == "partition_reduce_softmax"


def test_merge_and_sum_keys_make_valid_modules():
    for key in ("merge:P=2,D=32,out=f32", "sum:P=5",
                "merge:P=20,D=128,out=bf16,sink,output_norm,eps=1e-05"):
        bundle = attnres.compile(module=kernels.module_for_key(key),
                                 target="gfx942", format="isa")
        assert bundle.manifest["ops"]
    assert kernels.module_for_key("train:L=2,D=8") is None
    for bad in ("max:P=2", "merge:D=4,out=f32", "merge:P=x,D=4,out=f32",
                "merge:P=2,D=4,out=i8", "sum:"):
        with pytest.raises(attnres.InvalidArgumentError,
                           match="bad kernel key"):
            kernels.module_for_key(bad)
    with pytest.raises(attnres.InvalidArgumentError, match="cannot name"):
        kernels.bundle_name("train:L=2,D=8,x=a/b")


def test_kernel_store(tmp_path, monkeypatch):
    key, target = "sum:P=4", "gfx942"
    monkeypatch.setenv("ATTNRES_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNRES_BUNDLE_DIR", raising=False)
    # Compiled on first use into the cache, found there afterwards.
    folder = kernels.folder_for(key, target)
    assert folder.is_relative_to(tmp_path / "cache")
    assert folder.name == "sum__P=4"
    stamp = (folder / "manifest.json").stat().st_mtime_ns
    assert kernels.folder_for(key, target) == folder
    assert (folder / "manifest.json").stat().st_mtime_ns == stamp
    # Under the compiler's version and its library's fingerprint: another
    # build of the compiler, whose version string is the same, compiles
    # anew rather than loading this build's kernels.
    import hashlib
    library = _native._find(_native._COMPILER)
    fingerprint = hashlib.sha256(library.read_bytes()).hexdigest()[:16]
    assert folder.parent.parent.name.endswith("-" + fingerprint)
    assert folder.parent.parent.name.startswith("attnres-")
    monkeypatch.setattr(_native, "_compiler_fingerprint", "0" * 16)
    rebuilt = kernels.folder_for(key, target)
    assert rebuilt.parent.parent.name.endswith("-" + "0" * 16)
    assert rebuilt != folder and (rebuilt / "manifest.json").is_file()

    # A prebuilt folder wins over the cache.
    prebuilt = tmp_path / "prebuilt"
    monkeypatch.setenv("ATTNRES_BUNDLE_DIR", str(prebuilt))
    assert kernels.prebuild([key], target, prebuilt) == \
        [prebuilt / target / "sum__P=4"]
    assert kernels.folder_for(key, target) == prebuilt / target / "sum__P=4"

    # Without the compiler, a missing bundle says how to make one.
    monkeypatch.setattr(_native, "compiler_available", lambda: False)
    with pytest.raises(attnres.BundleError) as raised:
        kernels.folder_for("sum:P=6", target)
    assert "no prebuilt bundle in" in str(raised.value)
    assert "python -m attnres prebuild --target gfx942" in str(raised.value)


def test_canonical_key_is_the_order_the_ops_write():
    from attnres._checks import check_attnres
    from fakes import Tensor
    # Every spec the ops write is already canonical ...
    sources = [Tensor((2, 16, 64)) for _ in range(3)]
    for query, g, h, save in [
            (Tensor((64,)), None, None, "o_pre"),
            (Tensor((4, 32), "float32"), Tensor((32,), "float32"),
             Tensor((4, 64), "float32"), "lse"),
            (Tensor((32,)), Tensor((32,)), Tensor((64,)), "o_pre")]:
        call = check_attnres(sources, query, g, h, 1e-6, 0.5, save)
        for options in ({}, {"accumulate": True}, {"partial": True},
                        {"fp32_output": True},
                        {"accumulate": True, "fp32_output": True}):
            spec = call.spec(**options)
            assert kernels.canonical_key(spec) == spec
    # ... and a reordered one is put back in that order.
    assert kernels.canonical_key(
        "train:scale=1.0,accumulate,L=2,D=64,R=64,M=1,dtype=bf16,"
        "multi_query,save=o_pre,eps=1e-06") == \
        ("train:L=2,D=64,R=64,M=1,dtype=bf16,multi_query,accumulate,"
         "save=o_pre,eps=1e-06,scale=1.0")
    assert kernels.canonical_key("merge:eps=1e-05,output_norm,out=f32,D=8,"
                                 "sink,P=2") == \
        "merge:P=2,D=8,out=f32,sink,output_norm,eps=1e-05"
    # What it does not know it leaves to the compiler to name.
    for odd in ("train:D=8,L=2,wat", "train:D=8,L=2,D=8", "sum:", "max:P=2,x",
                "no colon"):
        assert kernels.canonical_key(odd) == odd


def test_prebuild_stores_a_key_where_the_ops_look(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRES_BUNDLE_DIR", str(tmp_path))
    monkeypatch.setattr(_native, "compiler_available", lambda: False)
    [folder] = kernels.prebuild(["merge:out=f32,D=64,P=2"], "gfx942", tmp_path)
    assert folder == tmp_path / "gfx942" / "merge__P=2_D=64_out=f32"
    assert kernels.folder_for("merge:P=2,D=64,out=f32", "gfx942") == folder


def test_prebuild_command(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "attnres", "prebuild", "--target", "gfx942",
         "--output", str(tmp_path), "sum:P=2", "merge:P=2,D=64,out=f32"],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "gfx942" / "sum__P=2" / "manifest.json").is_file()
    bad = subprocess.run(
        [sys.executable, "-m", "attnres", "prebuild", "--target", "gfx942",
         "--output", str(tmp_path), "train:L=2,D=64,eps=-1"],
        capture_output=True, text=True)
    assert bad.returncode == 1
    assert "error: spec 'train:L=2,D=64,eps=-1' is not a valid" in bad.stderr


def test_missing_library_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(_native, "library_dirs", lambda: [tmp_path])
    with pytest.raises(attnres.LibraryNotFoundError) as raised:
        _native._open("libAttnResNothing.so", "a test library")
    assert "cannot find libAttnResNothing.so (a test library)" in \
        str(raised.value)
    assert "ATTNRES_LIBRARY_DIR" in str(raised.value)


def test_kernel_options_name_bundles_of_their_own(tmp_path, monkeypatch):
    """A key compiled with kernel options (the residual history's pair
    pass) is a bundle of its own, named after them, compiled with them,
    found prebuilt or in the cache; options a folder cannot be named after
    are refused."""
    key = "sum:P=3"
    monkeypatch.setenv("ATTNRES_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNRES_BUNDLE_DIR", raising=False)
    options = "backward-source-batch=1 backward-threads-per-row=64"
    assert kernels.bundle_name(key, options) == \
        "sum__P=3+backward-source-batch=1+backward-threads-per-row=64"
    plain = kernels.folder_for(key, "gfx942")
    tuned = kernels.folder_for(key, "gfx942", options)
    assert tuned.parent == plain.parent and tuned != plain
    manifest = json.loads((tuned / "manifest.json").read_text())
    assert manifest["options"]["kernel_options"] == options
    assert not json.loads((plain / "manifest.json").read_text())[
        "options"].get("kernel_options")
    # prebuild takes (key, options) pairs beside plain keys.
    prebuilt = tmp_path / "prebuilt"
    folders = kernels.prebuild([key, (key, options)], "gfx942", prebuilt)
    assert [f.name for f in folders] == [plain.name, tuned.name]
    monkeypatch.setenv("ATTNRES_BUNDLE_DIR", str(prebuilt))
    assert kernels.folder_for(key, "gfx942", options) == folders[1]
    # Without the compiler, the message says how to prebuild with them.
    monkeypatch.setattr(_native, "compiler_available", lambda: False)
    with pytest.raises(attnres.BundleError) as raised:
        kernels.folder_for("sum:P=5", "gfx942", options)
    assert f"--kernel-options '{options}'" in str(raised.value)
    with pytest.raises(attnres.InvalidArgumentError, match="cannot name"):
        kernels.bundle_name(key, "backward-staged-batches=2;rm")
