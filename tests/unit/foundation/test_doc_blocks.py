"""Every shell block of the docs is run by a test or marked as needing a GPU cluster (``docblocks``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from treadle.testing import docblocks

ROOT = Path(__file__).resolve().parents[3]


def test_every_shell_block_says_how_it_is_tested() -> None:
    found = docblocks.blocks(ROOT)
    assert found, "no shell block found: the parser is broken"
    unmarked = [b.where for b in found if b.kind not in docblocks.KINDS]
    assert not unmarked, f"shell blocks without a `<!-- doc-test: KIND -->` line before them: {unmarked}"


def test_each_e2e_block_is_run_by_an_e2e_test() -> None:
    sources = {p: p.read_text() for p in (ROOT / "e2e").rglob("*.py")}
    for b in docblocks.blocks(ROOT):
        if b.kind != "e2e":
            continue
        assert b.ident, f"{b.where}: an e2e block needs an ID (`<!-- doc-test: e2e ID -->`)"
        callers = [p for p, text in sources.items() if "docblocks.block(" in text and f'"{b.ident}"' in text]
        assert callers, f"{b.where}: no test under e2e/ calls docblocks.block(ROOT, {b.ident!r})"


def test_commands_join_continuations_and_drop_comments() -> None:
    text = "make a   # first\n\n# only a comment\nhelm install x \\\n  --wait\necho '#1' # c"
    b = docblocks.Block(Path("x.md"), 1, "bash", "run", None, text)
    assert b.commands() == ["make a", "helm install x --wait", "echo '#1'"]


def test_a_marker_is_read_from_the_line_before_the_fence(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "charts" / "treadle").mkdir(parents=True)
    (tmp_path / "charts" / "treadle" / "README.md").write_text("")
    (tmp_path / "README.md").write_text(
        "<!-- doc-test: e2e first -->\n```bash\nmake demo\n```\n\n```python\nx = 1\n```\n```sh\nls\n```\n"
    )
    first, second = docblocks.blocks(tmp_path)
    assert (first.kind, first.ident, first.commands()) == ("e2e", "first", ["make demo"])
    assert (second.kind, second.line, second.commands()) == (None, 9, ["ls"])
    assert docblocks.block(tmp_path, "first") == first


def test_a_block_runs_as_one_shell_would(tmp_path: Path) -> None:
    text = (
        'export GREETING="hi $USER"\necho "$GREETING" > out.txt\nwhile true; do echo tick; sleep 0.05; done'
    )
    b = docblocks.Block(Path("x.md"), 1, "bash", "run", None, text)
    ran = docblocks.run(b, env={"PATH": "/usr/bin:/bin", "USER": "me"}, cwd=tmp_path, timeout_s=10,
                        watch={"while true": lambda seen: seen.count("tick") >= 3})  # fmt: skip
    assert (tmp_path / "out.txt").read_text() == "hi me\n" and ran[-1].output.count("tick") >= 3
    failing = docblocks.Block(Path("x.md"), 1, "bash", "run", None, "true\nfalse\ntouch never")
    with pytest.raises(AssertionError, match="`false` failed"):
        docblocks.run(failing, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert not (tmp_path / "never").exists()


def test_an_export_line_reports_what_it_changed(tmp_path: Path) -> None:
    b = docblocks.Block(Path("x.md"), 1, "bash", "run", None, 'export A=${A:-one} B=two\nexport C="$A$B"')
    first, second = docblocks.run(b, env={"PATH": "/usr/bin:/bin", "A": "set"}, cwd=tmp_path)
    assert first.output == "B=two\n" and second.output == "C=settwo\n"


def test_a_command_whose_wait_is_cut_short_is_stopped_with_it(tmp_path: Path) -> None:
    """A ``watch`` predicate that fails (as a test's assertion does) ends the command's whole process
    group too: it must not run on beside the next test."""
    b = docblocks.Block(Path("x.md"), 1, "bash", "run", None, "echo $$ > pid; exec sleep 60")

    def fails(seen: str) -> bool:
        if not (tmp_path / "pid").is_file():
            return False
        raise AssertionError("the job went Degraded")

    with pytest.raises(AssertionError, match="Degraded"):
        docblocks.run(b, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout_s=10, watch={"sleep": fails})
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # its process group is gone
