"""``python -m omni_serve.models build <preset> [--print-path]`` and ``list``."""

from __future__ import annotations

import argparse
import sys
import time

import omni_serve  # noqa: F401  (torchvision compat before transformers is imported)
from omni_serve.models.registry import ensure_model, presets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omni_serve.models")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build a random-weight checkpoint into the local cache")
    build.add_argument("preset", choices=presets())
    build.add_argument(
        "--print-path", action="store_true", help="print only the checkpoint path (for scripts)"
    )
    sub.add_parser("list", help="list presets")
    args = parser.parse_args(argv)
    if args.command == "list":
        print("\n".join(presets()))
        return 0
    start = time.perf_counter()
    if not args.print_path:
        print(f"building {args.preset} (cached after the first build)...", file=sys.stderr)
    path = ensure_model(args.preset)
    if not args.print_path:
        print(f"{args.preset} ready in {time.perf_counter() - start:.1f}s:", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
