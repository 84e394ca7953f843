"""What a new user does first: paste the README's snippets, run the test command in a clone.

The snippets themselves run in ``.ci/run`` (``tools/check_snippets.py``, minutes); here their
extraction and compilation, the rules of the checker on small texts, and the root
``conftest.py`` in checkouts whose folders are named like the package.
"""

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def snippets():
    """``tools/check_snippets.py`` as a module (``tools/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("check_snippets",
                                                  ROOT / "tools" / "check_snippets.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_readme_and_quickstart_blocks_are_found_and_compile(snippets):
    blocks = {path: snippets.extract(path) for path in snippets.DEFAULT_FILES}
    assert len(blocks["README.md"]) >= 2 and len(blocks["docs/quickstart.rst"]) >= 1
    for block in blocks["README.md"] + blocks["docs/quickstart.rst"]:
        compile(block.code, block.where(), "exec")
        assert "import" in block.code, f"{block.where()} imports nothing: not runnable alone"
    # the README's numbers are stated where they are printed, so the checker sees them
    assert sum(len(b.stated) for b in blocks["README.md"]) >= 3


def test_markdown_blocks_and_their_lines(snippets):
    text = "# t\n\n```bash\nls\n```\n\n```python\nx = 1\n\nprint(x)  # prints 1\n```\n"
    [block] = snippets.markdown_blocks(text, "a.md")
    assert block.line == 8 and block.code == "x = 1\n\nprint(x)  # prints 1\n"
    assert snippets.stated_numbers(block) == {3: (3, "1")}
    with pytest.raises(ValueError, match=r"a\.md:2: a ```python fence is never closed"):
        snippets.markdown_blocks("\n```python\nx = 1\n", "a.md")


def test_rst_blocks_end_at_the_first_dedented_line(snippets):
    text = textwrap.dedent("""\
        Title
        =====

        .. code-block:: python
           :caption: one

           import math

           print(math.pi)  # -> 3.14: pi
        Back to prose.

        .. code-block:: bash

           echo no
        """)
    [block] = snippets.rst_blocks(text, "q.rst")
    assert block.line == 7
    assert block.code == "import math\n\nprint(math.pi)  # -> 3.14: pi\n"
    assert snippets.stated_numbers(block) == {3: (3, "3.14")}


@pytest.mark.parametrize("code, message", [
    (">>> x = 1\n", "a '>>>' prompt"),
    ("x = 1  # prints 1\n", "not on the last line of a print"),
    ("print(1)  # prints one\n", "states no number"),
    ("print(1\n", "a.md:"),
])
def test_blocks_breaking_the_rules_name_their_line(snippets, tmp_path, code, message):
    (tmp_path / "a.md").write_text(f"```python\n{code}```\n")
    with pytest.raises(ValueError, match=message) as info:
        snippets.extract("a.md", root=tmp_path)
    assert "a.md:2" in str(info.value)


@pytest.mark.parametrize("stated, printed, ok", [
    ("0.870", "0.8704999\n", True),
    ("0.870", "0.8695001\n", True),
    ("0.870", "0.8706\n", False),
    ("0.8595", "0.8594888717849335\n", True),
    ("0.915", "0.8701369\n", False),
    ("[4.5 3.98]", "[4.47 3.98112]\n", True),
    ("[4.5 3.98]", "[4.47]\n", False),  # a number too few
    ("1e-3", "0.00149\n", True),
    ("1e-3", "0.0016\n", False),
    ("12", "12.4\n", True),
])
def test_compare_agrees_to_the_stated_decimals(snippets, stated, printed, ok):
    assert (snippets.compare(stated, printed) is None) is ok


def test_run_checks_each_stated_print_and_locates_errors(snippets):
    code = textwrap.dedent("""\
        import sys
        x = 0.25
        print(x,
              2 * x)  # prints 0.25 0.5: both
        print(x + 2)  # prints 1.3
        """)
    block = snippets.Block("a.md", 10, code)
    block.stated = snippets.stated_numbers(block)
    [failure] = snippets.run(block, echo=False)
    assert failure.startswith("a.md:14: states 1.3") and "printed 2.25" in failure

    block = snippets.Block("a.md", 10, "x = 1\nundefined_name\n")
    [failure] = snippets.run(block, echo=False)
    assert "error at a.md:11" in failure and "NameError" in failure


def test_snippets_run_in_a_folder_of_their_own(snippets, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = snippets.Block("a.md", 1, "open('litter.txt', 'w').close()\n")
    assert snippets.run(block, echo=False) == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("checkout", ["sklearn_fedmf", "sklearn_fedmf/src/clone", "plain"])
def test_root_conftest_collects_doctests_in_a_checkout_of_any_name(tmp_path, checkout):
    """A fake checkout with the root conftest.py and a package ``sklearn_fedmf`` whose doctest
    passes: collection must not take a folder above the package for the package."""
    root = tmp_path / checkout
    package = root / "sklearn_fedmf"
    (package / "sub").mkdir(parents=True)
    shutil.copy(ROOT / "conftest.py", root / "conftest.py")
    (root / "tests").mkdir()
    (root / "tests" / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    (package / "__init__.py").write_text('"""\n>>> 1 + 1\n2\n"""\n')
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "mod.py").write_text('def f():\n    """\n    >>> f()\n    3\n    """\n'
                                            "    return 3\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--doctest-modules",
         "tests", "sklearn_fedmf"], cwd=root, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout
