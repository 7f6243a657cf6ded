# -*- Python -*-
# lit configuration for the attnres regression tests.

import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "ATTNRES"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["CMakeLists.txt", "README.md", "lit.cfg.py", "lit.site.cfg.py", "Inputs", "driver", "corpus"]

config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.attnres_obj_root, "test")

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%attnres_src_root", config.attnres_src_root))
config.substitutions.append(("%attnres_obj_root", config.attnres_obj_root))
config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(("%cc", config.c_compiler))
config.substitutions.append(("%llvm_tools_dir", config.llvm_tools_dir))
config.substitutions.append(("%attnres_tools_dir", config.attnres_tools_dir))

llvm_config.with_system_environment(["HOME", "INCLUDE", "LIB", "TMP", "TEMP"])
llvm_config.use_default_substitutions()

tool_dirs = [config.attnres_tools_dir, config.llvm_tools_dir]
tools = ["attnres-opt", "attnres-numerics", "attnres-compile",
         "attnres-capi-test", "attnres-runtime-test",
         "attnres-runtime-cpp-test", "attnres-runtime-limits-test"]
if config.asan_runtime:
    tools += ["attnres-fuzz-mlir", "attnres-fuzz-spec", "attnres-fuzz-bundle"]
llvm_config.add_tool_substitutions(tools, tool_dirs)
# Upstream's own mlir-opt (Debian's mlir-opt-22), which loads the project's
# dialect and passes as plugins (docs/Embedding.md).
llvm_config.add_tool_substitutions(
    [ToolSubst("upstream-mlir-opt", command="mlir-opt")],
    [config.llvm_tools_dir])
config.substitutions.append(
    ("%attnres_plugin",
     os.path.join(config.attnres_obj_root, "lib", "AttnResPlugin.so")))
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)

# A sanitizer build (ATTNRES_SANITIZE): errors end the test; the ASan runtime
# is preloaded where an uninstrumented program (python3, FileCheck) loads the
# project's instrumented libraries. Leak checks stay off: the interpreter and
# MLIR's registries keep memory until exit by design.
if config.asan_runtime:
    config.available_features.add("sanitizers")
    config.environment["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0"
    config.environment["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    config.environment["LD_PRELOAD"] = config.asan_runtime

# GPU toolchains: NVIDIA binaries need ptxas (CUDA toolkit), AMD binaries the
# device libraries of rocm-device-libs. Tests that need them say REQUIRES.
ptxas = os.path.join(config.cuda_toolkit, "bin", "ptxas")
if os.path.exists(ptxas):
    config.available_features.add("ptxas")
    config.substitutions.append(("%ptxas", ptxas))
    config.substitutions.append(("%cuda_toolkit", config.cuda_toolkit))
if config.rocm_device_libs and os.path.exists(
        os.path.join(config.rocm_device_libs, "ocml.bc")):
    config.available_features.add("rocm-device-libs")

# A machine with the NVIDIA driver (where the runtime really loads bundles),
# and one with HIP's runtime library (ROCm).
import ctypes
for library, feature in (("libcuda.so.1", "cuda-driver"),
                         ("libamdhip64.so", "hip-runtime")):
    try:
        ctypes.CDLL(library)
        config.available_features.add(feature)
    except OSError:
        pass

# The GPU integration tests (Integration/GPU) run the kernels through
# PyTorch: they need an interpreter with PyTorch that sees a CUDA GPU
# (--param torch_python=PATH where that is not the build's Python) and
# compile their bundles for that GPU.
torch_python = lit_config.params.get("torch_python", config.python_executable)
config.substitutions.append(("%torch_python", torch_python))
if "cuda-driver" in config.available_features:
    import shutil
    import subprocess
    probe = ("import sys, numpy, torch\n"
             "if not torch.cuda.is_available(): sys.exit(1)\n"
             "print('sm_%d%d' % torch.cuda.get_device_capability())")
    try:
        found = subprocess.run([torch_python, "-c", probe],
                               capture_output=True, text=True, timeout=300)
        if found.returncode == 0 and found.stdout.strip():
            config.available_features.add("torch-cuda")
            config.substitutions.append(("%gpu_target",
                                         found.stdout.strip().splitlines()[-1]))
    except (OSError, subprocess.TimeoutExpired):
        pass
    if shutil.which("compute-sanitizer") or os.path.exists(
            os.path.join(config.cuda_toolkit, "bin", "compute-sanitizer")):
        config.available_features.add("compute-sanitizer")
        config.environment["PATH"] = os.path.join(
            config.cuda_toolkit, "bin") + os.pathsep + \
            config.environment["PATH"]
