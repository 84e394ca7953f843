"""The README shows what ``fedmf --quiet`` prints: the main job runs in a fresh interpreter
and its output is compared with the README's block line by line, every figure but the
``seconds`` column (the only one that depends on the machine)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def readme_block():
    """The README's fenced block that shows the main job's output."""
    blocks = re.findall(r"^```\n(.*?)^```$", README.read_text(), flags=re.S | re.M)
    shown = [b for b in blocks if b.startswith("data: MovieLens latest-small (embedded)")]
    assert len(shown) == 1, "the README shows the main job's output in one block"
    return shown[0].rstrip("\n").splitlines()


def without_seconds(lines):
    """The lines with each table row's ``seconds`` cell (right-aligned under the header's
    ``seconds``) replaced."""
    header = next(k for k, line in enumerate(lines) if re.search(r"\bseconds\b", line))
    end = re.search(r"\bseconds\b", lines[header]).end()
    masked = list(lines)
    for k in range(header + 2, len(lines)):
        if len(lines[k]) > end and lines[k][end - 1].isdigit():
            start = lines[k].rindex(" ", 0, end) + 1
            # (the padding goes too: a cell of more digits is no other figure)
            masked[k] = lines[k][:start].rstrip() + " <seconds>" + lines[k][end:]
    return masked


@pytest.mark.slow
def test_readme_shows_what_the_main_job_prints(tmp_path):
    # stdout and stderr (the notes) interleaved as on a terminal
    result = subprocess.run([sys.executable, "-m", "sklearn_fedmf", "--quiet"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stdout
    printed = result.stdout.rstrip("\n").splitlines()
    assert without_seconds(printed) == without_seconds(readme_block())


def test_the_masking_keeps_every_other_cell():
    lines = ["method   rounds  seconds  MB up", "-" * 32, "global mean   1      0.0    0.0",
             "FedMAvg      51     12.5  295.2", "note: 12.5 s"]
    masked = without_seconds(lines)
    assert masked[2:] == ["global mean   1 <seconds>    0.0", "FedMAvg      51 <seconds>  295.2",
                          "note: 12.5 s"]
    # a seconds figure of another width masks the same (README's block against a new run)
    assert without_seconds(lines[:3] + ["FedMAvg      51      9.5  295.2"])[3] == masked[3]
