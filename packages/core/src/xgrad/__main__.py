"""The `xgrad` command line (also `python -m xgrad`). Subcommands: `info` (the default)."""

from __future__ import annotations

import argparse
import sys

from xgrad.info import main as info_main
from xgrad.version import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xgrad", description="xgrad command line")
    parser.add_argument("--version", action="version", version=f"xgrad {__version__}")
    commands = parser.add_subparsers(dest="command")
    info = commands.add_parser("info", help="list plugins, devices, renderers, the default device and changed knobs")
    info.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command in (None, "info"):
        return info_main(as_json=bool(getattr(args, "json", False)))
    parser.error(f"unknown command {args.command}")  # unreachable: argparse rejects unknown subcommands


if __name__ == "__main__":
    sys.exit(main())
