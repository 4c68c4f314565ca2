"""The shell command blocks of the docs, and how each is tested.

Every fenced ``bash`` / ``sh`` / ``shell`` / ``console`` block of ``README.md``, ``docs/**/*.md`` and
``charts/treadle/README.md`` follows a marker comment on the line before its fence::

    <!-- doc-test: run -->            the integration tier runs it as written (cheap commands)
    <!-- doc-test: e2e ID -->         an e2e test runs it: the test calls ``block(ROOT, "ID")``
    <!-- doc-test: gpu-cluster -->    needs a GPU cluster: no test here can run it

``tests/unit/foundation/test_doc_blocks.py`` holds every block to that (a block without a marker, an
unknown kind, or an ``e2e`` ID no test under ``e2e/`` names fails it), so a command added to the
docs is either run by a test or says why it cannot be.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

SHELL = ("bash", "sh", "shell", "console")
KINDS = ("run", "e2e", "gpu-cluster")
MARKER = re.compile(r"^<!--\s*doc-test:\s*(?P<kind>[-a-z0-9]+)(?:\s+(?P<ident>[-a-z0-9]+))?\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    kind: str | None
    """The marker's kind; None when the line before the fence is no marker."""
    ident: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def part(self, start: int, stop: int | None = None) -> Block:
        """The block cut to ``commands()[start:stop]`` (a test that runs it in steps)."""
        return dataclasses.replace(self, text="\n".join(self.commands()[start:stop]))

    def commands(self) -> list[str]:
        """The block's commands: continuation lines joined, comments and blank lines dropped."""
        out, pending = [], ""
        for raw in self.text.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1].rstrip() + " "
                continue
            pending = ""
            command = _strip_comment(line)
            if command:
                out.append(command)
        return out


def _strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes that follows a space)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def doc_files(root: Path) -> list[Path]:
    return [
        root / "README.md",
        root / "charts" / "treadle" / "README.md",
        *sorted((root / "docs").rglob("*.md")),
    ]


def blocks(root: Path) -> list[Block]:
    """Every shell block of the docs, with its marker (paths relative to ``root``)."""
    out = []
    for path in doc_files(root):
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = FENCE.match(lines[i])
            if fence is None:
                i += 1
                continue
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            if fence["lang"] in SHELL:
                marker = MARKER.match(lines[i - 1]) if i > 0 else None
                out.append(Block(
                    path.relative_to(root), i + 1, fence["lang"], marker["kind"] if marker else None,
                    marker["ident"] if marker else None, "\n".join(lines[i + 1 : end]),
                ))  # fmt: skip
            i = end + 1
    return out


def block(root: Path, ident: str) -> Block:
    """The one block marked ``e2e ident``."""
    found = [b for b in blocks(root) if b.ident == ident]
    if len(found) != 1:
        raise LookupError(f"{len(found)} doc blocks are marked {ident!r}, expected 1")
    return found[0]


@dataclasses.dataclass(frozen=True)
class Ran:
    command: str
    output: str
    """stdout and stderr together."""


def run(
    b: Block,
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout_s: float = 600,
    watch: Mapping[str, Callable[[str], bool]] | None = None,
) -> list[Ran]:
    """Run ``b``'s commands one by one with ``bash -o pipefail``, stopping at the first failure.

    A command that never ends by itself (``kubectl get -w``, ``kubectl logs -f``) is given in ``watch``
    by a substring of it, with the predicate on its output so far that ends it (then it is stopped,
    and it passes); it fails if ``timeout_s`` passes first. An ``export`` line changes the environment
    of the commands after it, as in one shell; its ``Ran.output`` lists the variables it changed.
    """
    out, env = [], dict(env)
    for command in b.commands():
        if command.startswith("export "):
            shown = subprocess.run(
                ["bash", "-c", f"{command} && env -0"],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            after = dict(item.split("=", 1) for item in shown.split("\0") if "=" in item)
            for shells_own in ("PWD", "SHLVL", "_", "OLDPWD"):
                after.pop(shells_own, None)
            changed = "".join(f"{k}={v}\n" for k, v in sorted(after.items()) if env.get(k) != v)
            env = after
            out.append(Ran(command, changed))
            continue
        until = next((p for key, p in (watch or {}).items() if key in command), None)
        with tempfile.TemporaryFile("w+") as log:
            proc = subprocess.Popen(
                ["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env, text=True,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            deadline, done = time.monotonic() + timeout_s, False
            try:
                while True:
                    exited = proc.poll() is not None
                    log.seek(0)
                    seen = log.read()
                    if until is not None and until(seen):
                        done = True
                        break
                    if exited or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            finally:
                # Also when the wait is cut short (a ``watch`` predicate's assertion, pytest-timeout): a
                # demo left running in its own session went on beside the next tests, on their cluster.
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(30)
        if not done and proc.returncode != 0:
            why = "timed out" if time.monotonic() > deadline else f"exit {proc.returncode}"
            raise AssertionError(f"{b.where}: `{command}` failed ({why}):\n{seen[-3000:]}")
        out.append(Ran(command, seen))
    return out
