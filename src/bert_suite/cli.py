"""`bert-suite ...`: argument parsing only; the work lives in the modules it calls.

Errors the user can fix (bad files, bad flags) are printed as one line and exit with status 2;
set BERT_SUITE_DEBUG=1 to see the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys


def _export(args: argparse.Namespace) -> None:
    from .export import export_to_bert

    dst = export_to_bert(args.src, args.dst)
    print(f"exported {args.src} -> {dst} (stock transformers BERT)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bert-suite", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    export = sub.add_parser("export", help="convert a bert_suite checkpoint to another format")
    export.add_argument("--to", choices=["bert"], required=True, help="target format (stock transformers BERT)")
    export.add_argument("src", help="bert_suite checkpoint folder")
    export.add_argument("dst", help="output folder")
    export.set_defaults(func=_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError, KeyError) as err:
        if os.environ.get("BERT_SUITE_DEBUG"):
            raise
        print(f"bert-suite {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
