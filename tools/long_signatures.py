"""List the package's functions with more than 20 parameters (the style rule's limit).

    python tools/long_signatures.py                  # sklearn_fedmf/, limit 20
    python tools/long_signatures.py PATH --limit N

Parameters are counted from the source (``ast``): positional-only, positional and
keyword-only ones, and ``*args`` and ``**kwargs`` as one each. An estimator's ``__init__``
(one per constructor parameter) is allowed and listed apart; the exit status is 1 when any
other function is over the limit.
"""

import argparse
import ast
import sys
from pathlib import Path


def n_parameters(args):
    """The number of parameters of an ``ast.arguments``."""
    return (len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
            + (args.vararg is not None) + (args.kwarg is not None))


def long_signatures(root, limit):
    """``[(n, "path:line", name)]`` of the functions under ``root`` with more than ``limit``
    parameters, longest first."""
    rows = []
    for path in sorted(Path(root).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                n = n_parameters(node.args)
                if n > limit:
                    rows.append((n, f"{path}:{node.lineno}", getattr(node, "name", "<lambda>")))
    return sorted(rows, key=lambda row: (-row[0], row[1]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="sklearn_fedmf")
    parser.add_argument("--limit", type=int, default=20)
    args = parser.parse_args(argv)
    rows = long_signatures(args.root, args.limit)
    over = [row for row in rows if row[2] != "__init__"]
    for n, where, name in rows:
        print(f"{n:3d}  {where}  {name}")
    print(f"{len(rows)} functions with more than {args.limit} parameters, {len(over)} of them "
          "not an __init__")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
