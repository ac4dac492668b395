"""docs/python.md stays true: its complete program runs against the cluster and prints
what it says, and every Python block of the guide at least compiles."""

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "python.md"


def python_blocks(text: str) -> List[str]:
    """The ```python blocks of a markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_every_python_block_compiles() -> None:
    blocks = python_blocks(GUIDE.read_text())
    assert len(blocks) >= 8
    for index, block in enumerate(blocks):
        compile(block, f"{GUIDE}: python block {index + 1}", "exec")


def test_the_complete_program_runs(endpoint: str) -> None:
    """The guide's last block, run as a program with WARDEN_ENDPOINTS naming the cluster."""
    text = GUIDE.read_text()
    program = python_blocks(text[text.index("## A complete program") :])[0]
    environment = dict(os.environ, WARDEN_ENDPOINTS=endpoint)
    ran = subprocess.run(
        [sys.executable, "-c", program], env=environment, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert ran.returncode == 0, f"stdout:\n{ran.stdout}\nstderr:\n{ran.stderr}"
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("holding /docs/python/lock with token ")
    assert lines[1].startswith("leading /docs/python/election with token ")
    events = lines[2:]
    assert any(line.startswith("CREATED /docs/python/worker-") for line in events)
    assert events[-1].startswith("DELETED /docs/python/worker-")
    revisions = [int(line.rsplit(" ", 1)[1]) for line in events]
    assert revisions == sorted(revisions)
