"""Run every Python snippet of the README and the quick start, each alone, and check its numbers.

    python tools/check_snippets.py                     # README.md and docs/quickstart.rst
    python tools/check_snippets.py docs/guide/x.rst    # other files
    python tools/check_snippets.py --list              # the blocks found, without running them

What counts as a snippet:

* Markdown (``.md``): a fenced block opened by a line ```` ```python ````.
* reStructuredText (``.rst``): the body of a ``.. code-block:: python`` directive (also
  ``.. code::`` and ``.. sourcecode::``), options and indentation removed. Literal ``::``
  blocks are output in this project's documents, not code, and are not run.
* A Python block must be a script a reader can paste: a line starting with ``>>>`` is an
  error (examples with prompts belong in docstrings, which the test suite runs as doctests).

Each block runs alone, in a fresh interpreter (``sys.executable``), with a temporary folder
as its working directory (so whatever it writes is thrown away) and this checkout first on
``PYTHONPATH`` (so the snippets test this checkout's code). Any exception, a non-zero exit or
a timeout fails the check with the block's file and line, and the file line of the error.
A block with the same code as an earlier one (the README's quick start is also the docs')
runs once.

Stated numbers: a ``print(...)`` statement whose (last) line ends in a comment starting with
``prints`` or ``->`` states what it prints::

    print(-model.score(X_train, X_test))    # prints 0.8595: test RMSE by fold-in
    print(reg.predict(pairs))               # -> [4.49 3.98]

The numbers of the comment, up to a ``:`` followed by a space (the rest is prose), are
compared in order with the numbers of the printed text; there must be as many. Each must
agree to the decimals it is stated with: ``0.870`` accepts a printed value ``v`` when
``|v - 0.870| <= 0.0005`` (half a unit of its last digit, that is: ``v`` rounds to it).
A number in the prose of a comment without ``prints``/``->`` is not checked, so a comment
that states what a line prints must say ``prints``.

Exit status 0 when every block passes, 1 otherwise. Standard library only.
"""

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FILES = ("README.md", "docs/quickstart.rst")
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
STATED = re.compile(r"#\s*(?:prints\b|->)\s*(?P<text>.*)$")
RST_DIRECTIVE = re.compile(r"^(?P<indent>\s*)\.\. (?:code-block|code|sourcecode)::\s*python3?\s*$")

# Runs in the snippet's interpreter: the snippet's own ``print`` (a global of the snippet, not
# a replaced builtin, which numba's typing would notice) records what each call printed, by
# line; then the snippet runs as __main__.
DRIVER = """
import builtins, io, json, runpy, sys
snippet, record = sys.argv[1], sys.argv[2]
printed = []

def recording_print(*args, **kwargs):
    if kwargs.get("file") is None:
        buffer = io.StringIO()
        builtins.print(*args, **{**kwargs, "file": buffer})
        printed.append([sys._getframe(1).f_lineno, buffer.getvalue()])
    builtins.print(*args, **kwargs)

try:
    runpy.run_path(snippet, init_globals={"print": recording_print}, run_name="__main__")
finally:
    with open(record, "w") as f:
        json.dump(printed, f)
"""


@dataclass
class Block:
    """A Python snippet: its source file, the file line of its first code line, its code."""

    path: str
    line: int
    code: str
    stated: dict = field(default_factory=dict)  # first line -> (last line, comment text)

    def where(self, offset=1):
        """``file:line`` of the block's line ``offset`` (1-based)."""
        return f"{self.path}:{self.line + offset - 1}"


def markdown_blocks(text, path="<md>"):
    """The ```` ```python ```` fenced blocks of a Markdown text."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() in ("```python", "```python3", "```py"):
            start = i + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            if end == len(lines):
                raise ValueError(f"{path}:{i + 1}: a ```python fence is never closed")
            blocks.append(Block(path, start + 1, "\n".join(lines[start:end]) + "\n"))
            i = end
        i += 1
    return blocks


def rst_blocks(text, path="<rst>"):
    """The bodies of the ``.. code-block:: python`` directives of a reStructuredText text."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = RST_DIRECTIVE.match(lines[i])
        i += 1
        if not match:
            continue
        indent = len(match["indent"])
        # options (":linenos:", ...) then the body: every line indented deeper than the
        # directive, blank lines included, up to the first line that is not
        while i < len(lines) and lines[i].strip().startswith(":") and lines[i].strip():
            i += 1
        body_start = i
        while i < len(lines) and (not lines[i].strip()
                                  or len(lines[i]) - len(lines[i].lstrip()) > indent):
            i += 1
        body = lines[body_start:i]
        while body and not body[0].strip():
            body, body_start = body[1:], body_start + 1
        while body and not body[-1].strip():
            body = body[:-1]
        if not body:
            raise ValueError(f"{path}:{body_start}: an empty code-block")
        margin = min(len(line) - len(line.lstrip()) for line in body if line.strip())
        code = "\n".join(line[margin:] for line in body) + "\n"
        blocks.append(Block(path, body_start + 1, code))
    return blocks


def extract(path, root=ROOT):
    """Every Python block of the file ``path`` (relative to ``root`` or absolute), with its
    stated numbers; a ValueError names the file and line of a block that breaks the rules."""
    full = Path(root, path)
    text = full.read_text(encoding="utf-8")
    name = str(path)
    blocks = markdown_blocks(text, name) if full.suffix == ".md" else rst_blocks(text, name)
    for block in blocks:
        for k, line in enumerate(block.code.splitlines(), 1):
            if line.lstrip().startswith(">>>"):
                raise ValueError(f"{block.where(k)}: a '>>>' prompt in a Python block; write "
                                 "the snippet as a script (prompts belong in docstrings)")
        block.stated = stated_numbers(block)
    return blocks


def stated_numbers(block):
    """``{first line: (last line, stated text)}`` of the block's annotated print statements
    (lines relative to the block). Raises ValueError if the code does not parse or an
    annotation is not on a ``print(...)`` statement."""
    try:
        tree = ast.parse(block.code, filename=block.path)
    except SyntaxError as exc:
        raise ValueError(f"{block.where(exc.lineno or 1)}: {exc.msg}") from None
    prints = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "print"):
            prints[node.end_lineno] = node.lineno
    stated = {}
    for k, line in enumerate(block.code.splitlines(), 1):
        match = STATED.search(line)
        if match is None:
            continue
        if k not in prints:
            raise ValueError(f"{block.where(k)}: a '# prints' comment not on the last line of "
                             "a print(...) statement")
        text = match["text"].split(": ", 1)[0]
        if not NUMBER.search(text):
            raise ValueError(f"{block.where(k)}: '# prints' states no number: {line.strip()}")
        stated[prints[k]] = (k, text)
    return stated


def compare(stated, printed):
    """None when the numbers of ``printed`` agree with those of ``stated`` to the stated
    decimals, else the reason."""
    want, got = NUMBER.findall(stated), NUMBER.findall(printed)
    if len(want) != len(got):
        return f"states {len(want)} number(s) ({stated}), printed {len(got)}: {printed.strip()}"
    for w, g in zip(want, got):
        mantissa = re.split("[eE]", w)[0]
        decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        exponent = int(re.split("[eE]", w)[1]) if re.search("[eE]", w) else 0
        tolerance = 0.5 * 10.0 ** (exponent - decimals)
        if abs(float(g) - float(w)) > tolerance * (1 + 1e-9):
            return f"states {w} (+/- {tolerance:g}), printed {g}: {printed.strip()}"
    return None


def run(block, *, timeout=600, echo=True):
    """Run ``block`` alone in a fresh interpreter; return the list of its failures."""
    with tempfile.TemporaryDirectory(prefix="snippet-") as work:
        snippet, record = Path(work, "snippet.py"), Path(work, "printed.json")
        snippet.write_text(block.code, encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), "MPLBACKEND": "Agg"}
        try:
            result = subprocess.run(
                [sys.executable, "-c", DRIVER, str(snippet), str(record)], cwd=work, env=env,
                capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return [f"{block.where()}: did not finish in {timeout} s"]
        if echo and result.stdout:
            print("    " + result.stdout.rstrip().replace("\n", "\n    "))
        if result.returncode != 0:
            lines = re.findall(rf'File "{re.escape(str(snippet))}", line (\d+)', result.stderr)
            at = f" (error at {block.where(int(lines[-1]))})" if lines else ""
            tail = "\n".join(result.stderr.rstrip().splitlines()[-15:])
            return [f"{block.where()}: exit status {result.returncode}{at}\n{tail}"]
        printed = json.loads(record.read_text())
    failures = []
    for first, (last, text) in block.stated.items():
        calls = [out for line, out in printed if first <= line <= last]
        if len(calls) != 1:
            failures.append(f"{block.where(last)}: the annotated print ran {len(calls)} times")
            continue
        reason = compare(text, calls[0])
        if reason:
            failures.append(f"{block.where(last)}: {reason}")
    return failures


def _children_cpu():
    """CPU seconds used by the finished child processes (and theirs) so far."""
    times = os.times()
    return times.children_user + times.children_system


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES,
                        help="Markdown or reStructuredText files, relative to the checkout "
                             "(default: %(default)s)")
    parser.add_argument("--list", action="store_true", help="list the blocks, do not run them")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per block")
    args = parser.parse_args(argv)
    try:
        blocks = [block for path in args.files for block in extract(path)]
    except (OSError, ValueError) as exc:
        print(f"check_snippets: {exc}", file=sys.stderr)
        return 1
    failures, start = [], time.perf_counter()
    first_of = {}  # code -> the first block with that code (README and docs share snippets)
    for block in blocks:
        checks = len(block.stated)
        if args.list:
            print(f"{block.where()}: {len(block.code.splitlines())} lines, "
                  f"{checks} stated number(s)")
            continue
        if block.code in first_of:
            print(f"{block.where()}: the code of {first_of[block.code].where()}, checked there")
            continue
        first_of[block.code] = block
        print(f"{block.where()}: running ({checks} stated number(s))", flush=True)
        began, cpu = time.perf_counter(), _children_cpu()
        found = run(block, timeout=args.timeout)
        # CPU seconds too: on a shared machine the wall time says little about the snippet
        print(f"{block.where()}: {'FAILED' if found else 'ok'} "
              f"({time.perf_counter() - began:.1f} s, {_children_cpu() - cpu:.1f} CPU s)",
              flush=True)
        failures += found
    if args.list:
        return 0
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    checked = sum(len(b.stated) for b in first_of.values())
    print(f"snippets: {len(blocks)} block(s) ({len(first_of)} distinct, each run alone), "
          f"{checked} stated number(s), {len(failures)} failure(s) in "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if failures or not blocks else 0


if __name__ == "__main__":
    sys.exit(main())
