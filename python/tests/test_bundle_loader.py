"""The bundle loader reads only what a bundle may hold: regular files of its
own folder, named by plain file names, of bounded size. Each case is a
bundle as an attacker or an accident would make it; loading must fail with a
BundleError that says why, never read elsewhere, block or run out of
memory."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import attnres

@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundles") / "good"
    attnres.compile("forward:L=2,D=64", target="gfx942", output=folder)
    return folder


def copy_with(good_bundle, tmp_path, binary_name):
    """A copy of the good bundle, its manifest naming `binary_name`."""
    folder = tmp_path / "bundle"
    shutil.copytree(good_bundle, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["binaries"][0]["file"] = binary_name
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_good_bundle_loads(good_bundle):
    assert [op.kind for op in attnres.inspect(good_bundle).ops] == ["forward"]


@pytest.mark.parametrize("name", [
    "../../../../../../../../etc/passwd", "/etc/passwd", "..", ".",
    "sub/kernels.hsaco", "", "a\\b"])
def test_binary_names_a_plain_file(good_bundle, tmp_path, name):
    folder = copy_with(good_bundle, tmp_path, name)
    with pytest.raises(attnres.BundleError,
                       match="inside its own folder by a plain file name"):
        attnres.inspect(folder)


def test_binary_link_out_of_the_folder(good_bundle, tmp_path):
    folder = copy_with(good_bundle, tmp_path, "kernels.hsaco")
    (folder / "kernels.hsaco").symlink_to("/etc/passwd")
    with pytest.raises(attnres.BundleError,
                       match="outside the bundle folder"):
        attnres.inspect(folder)


def test_link_inside_the_folder_is_fine(good_bundle, tmp_path):
    folder = copy_with(good_bundle, tmp_path, "kernels.hsaco")
    (folder / "kernels.hsaco").symlink_to(
        folder / "attnres_kernels.gfx942.hsaco")
    assert attnres.inspect(folder).ops


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_manifest_link_to_a_device(good_bundle, tmp_path, device):
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "manifest.json").symlink_to(device)
    with pytest.raises(attnres.BundleError, match="outside the bundle folder"):
        attnres.inspect(folder)


def test_fifo_does_not_block(good_bundle, tmp_path):
    folder = copy_with(good_bundle, tmp_path, "kernels.hsaco")
    os.mkfifo(folder / "kernels.hsaco")
    # In a child process: a loader that blocks on the FIFO fails the timeout
    # instead of hanging the test session.
    code = ("import attnres, sys\n"
            "try:\n"
            f"    attnres.inspect({str(folder)!r})\n"
            "except attnres.BundleError as e:\n"
            "    print(e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                            text=True, timeout=60, env=os.environ)
    assert "is not a regular file" in result.stdout, result.stderr


def test_folder_as_binary(good_bundle, tmp_path):
    folder = copy_with(good_bundle, tmp_path, "kernels")
    (folder / "kernels").mkdir()
    with pytest.raises(attnres.BundleError, match="not a regular file"):
        attnres.inspect(folder)


def test_size_caps(good_bundle, tmp_path):
    # Sparse files: the size is what is checked, nothing is read.
    folder = copy_with(good_bundle, tmp_path, "huge.hsaco")
    with open(folder / "huge.hsaco", "wb") as f:
        f.truncate(3 << 30)
    with pytest.raises(attnres.BundleError, match="may be at most"):
        attnres.inspect(folder)
    with open(folder / "manifest.json", "r+b") as f:
        f.truncate(1 << 30)
    with pytest.raises(attnres.BundleError,
                       match="manifest.json may be at most 16777216 bytes"):
        attnres.inspect(folder)


def test_binary_that_is_not_a_string(good_bundle, tmp_path):
    folder = copy_with(good_bundle, tmp_path, 42)
    with pytest.raises(attnres.BundleError, match="exactly one binary"):
        attnres.inspect(folder)
