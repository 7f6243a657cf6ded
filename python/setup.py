"""Puts the built shared libraries into the package (attnres/lib) so that an
installed attnres needs no ATTNRES_LIBRARY_DIR. They come from
$ATTNRES_BUILD_DIR/lib, or <repo>/build/lib; a tree without them installs
the pure-Python part, which then looks for them at run time. The build
tree's ROCm toolkit folder (ld.lld and the AMD device libraries, which the
ROCDL pipeline links with) goes next to them, in attnres/lib/attnres/, where
the compiler library looks for it from its own location."""

import os
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
LIBRARIES = ("libAttnResRuntime.so", "libAttnResCAPI.so")


class BuildWithLibraries(build_py):
    def run(self):
        super().run()
        build = pathlib.Path(os.environ.get("ATTNRES_BUILD_DIR",
                                            HERE.parent / "build"))
        target = pathlib.Path(self.build_lib) / "attnres" / "lib"
        for name in LIBRARIES:
            library = build / "lib" / name
            if library.is_file():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(library, target / name)
        toolkit = build / "rocm-toolkit"
        if (target / "libAttnResCAPI.so").is_file() and toolkit.is_dir():
            # The folder holds links to system files; a wheel stores what
            # they point to.
            shutil.copytree(toolkit, target / "attnres" / "rocm-toolkit",
                            symlinks=True, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithLibraries})
