"""python -m attnres prebuild --target sm_90 --output DIR [--kernel-options
'NAME=VALUE ...'] KEY...

Compiles kernel bundles for machines without the compiler: point
ATTNRES_BUNDLE_DIR at DIR there."""

import argparse
import sys

from .errors import AttnresError
from .kernels import prebuild


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m attnres")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("prebuild", help=__doc__.splitlines()[0])
    build.add_argument("--target", default="sm_90")
    build.add_argument("--output", required=True)
    build.add_argument("--kernel-options", default="",
                       help="convert-attnres-to-gpu options the bundles are "
                       "compiled with (their folders are named after them)")
    build.add_argument("keys", nargs="+",
                       help="specs (train:L=...,D=...) or merge:/sum: keys")
    args = parser.parse_args(argv)
    try:
        for folder in prebuild(args.keys, args.target, args.output,
                               args.kernel_options):
            print(folder)
    except AttnresError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
