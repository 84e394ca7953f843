"""Sphinx configuration. Build with ``python -m sphinx -b html docs docs/_build/html``."""

import os
import shlex
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sklearn_fedmf  # noqa: E402

project = "sklearn_fedmf"
author = "sklearn_fedmf developers"
copyright = "sklearn_fedmf developers; BSD-3-Clause"
version = release = sklearn_fedmf.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
]
autosummary_generate = False  # summary tables only; the entries are autodoc directives below
autodoc_default_options = {"member-order": "bysource"}
# Flower (the flower extra) needs Python >= 3.11 and is a heavy install: autodoc imports
# sklearn_fedmf.flower against a stand-in, so the docs build from the docs extra alone (and the
# same way where Flower is installed). The secure module's ``cryptography`` is in the extra.
autodoc_mock_imports = ["flwr"]
numpydoc_show_class_members = False  # autodoc lists the members
numpydoc_class_members_toctree = False
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_theme_options = {"description": "Federated matrix factorization for scikit-learn",
                      "fixed_sidebar": True}
html_title = f"sklearn_fedmf {release}"


class FedmfHelp(Directive):
    """``.. fedmf-help:: run`` renders ``fedmf run --help`` from the parser itself."""

    optional_arguments = 1
    final_argument_whitespace = True

    def run(self):
        from sklearn_fedmf.cli import build_parser

        os.environ["COLUMNS"] = "88"  # argparse wraps to the terminal width
        parser = build_parser()
        words = shlex.split(self.arguments[0]) if self.arguments else []
        if words:
            parser = parser._subparsers._group_actions[0].choices[words[0]]
        text = parser.format_help()
        return [nodes.literal_block(text, text)]


class FedmfMethods(Directive):
    """``.. fedmf-methods::`` a table of the command's method registry and default grids."""

    def run(self):
        from sklearn_fedmf.cli import METHODS

        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 12 30 26 32", "",
                 "   * - name", "     - estimator", "     - a client uploads",
                 "     - default ``tune`` grid"]
        for m in METHODS.values():
            fixed = ", ".join(f"{k}={v!r}" for k, v in m.fixed.items())
            target = m.target.replace(":", ".")
            # a grid, or a list of sub-grids (GridSearchCV's param_grid): one bullet each
            grids = [_grid_text(g) for g in (m.grid if isinstance(m.grid, list) else [m.grid])]
            cell = ([f"     - {grids[0]}"] if len(grids) == 1 else
                    ["     - * " + grids[0]] + [f"       * {g}" for g in grids[1:]])
            lines += [f"   * - ``{m.name}``", f"     - :class:`{target}`"
                      + (f" (``{fixed}``)" if fixed else ""), f"     - {m.sends}", *cell]
        node = nodes.section()
        self.state.nested_parse(StringList(lines), self.content_offset, node)
        return node.children


class FedmfSolverParams(Directive):
    """``.. fedmf-solver-params:: sklearn_fedmf.FedMAvg`` the class's ``solver_params`` keys
    and their defaults, read from the class (``_solver_params``), so the table cannot go stale."""

    required_arguments = 1

    def run(self):
        from importlib import import_module

        module, _, name = self.arguments[0].rpartition(".")
        cls = getattr(import_module(module), name)
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 30 70", "",
                 "   * - key", "     - default"]
        for key, (default, _) in cls._solver_params.items():
            lines += [f"   * - ``{key}``", f"     - ``{default!r}``"]
        node = nodes.section()
        self.state.nested_parse(StringList(lines), self.content_offset, node)
        return node.children


def _grid_text(grid):
    """``alpha_u`` 1, 10; ``beta`` auto, 0.01: one grid as the text of a table cell."""
    return "; ".join(f"``{k}`` " + ", ".join(f"{v:g}" if isinstance(v, float) else str(v)
                                             for v in values)
                     for k, values in grid.items())


def setup(app):
    app.add_directive("fedmf-help", FedmfHelp)
    app.add_directive("fedmf-methods", FedmfMethods)
    app.add_directive("fedmf-solver-params", FedmfSolverParams)
