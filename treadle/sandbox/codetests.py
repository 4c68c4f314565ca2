"""Judge a model response against test code with a verdict the response cannot forge; used by the
python-code env and the reward gateway's ``code-tests`` so both judge code the same way.

The response's code and the tests run as two sandboxed processes (``Sandbox.run_connected``), each
under a uid and directory of its own. The **code** process runs the response, then answers calls:
a name and arguments in, the function's result (or the exception's type and message) out. The
**harness** process runs the tests, where every name the tests use but do not define is a stub that
makes that call; only plain data crosses (``repr`` out, ``ast.literal_eval`` in), so an object that
claims to equal anything (``__eq__`` returning True) cannot, and the comparisons run in the harness.
The verdict is the harness's own last line of output, printed once the last test statement returned:
the code process cannot write to that output, read the tests, or signal, trace or kill-and-replace
the harness (an ended harness prints nothing and the run does not pass). Printing the marker, exiting
early or writing on the channel earns nothing.

What crosses must be literal data (numbers, strings, bytes, tuples, lists, dicts, sets, None, bools):
tests that pass callbacks or inspect objects of the response's classes fail with an error that says
so.
"""

from __future__ import annotations

import dataclasses
import re

from treadle.sandbox import runner

FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
VERDICT = "TREADLE-TESTS-PASSED"

# Appended to the response's code: answer the harness's calls until it closes the channel. A response
# that exits first, or answers wrong, only fails its own tests.
SERVE = """

# --- the sandbox answers the tests' calls from here on ---
def __treadle_serve():
    import ast, os
    ask = os.fdopen(int(os.environ["TREADLE_CHANNEL_IN"]), "r")
    answer = os.fdopen(int(os.environ["TREADLE_CHANNEL_OUT"]), "w")
    for line in ask:
        try:
            name, args, kwargs = ast.literal_eval(line)
            reply = repr(("ok", globals()[name](*args, **kwargs)))
        except KeyError as e:
            reply = repr(("raise", "NameError", f"name {e} is not defined by the code"))
        except BaseException as e:
            reply = repr(("raise", type(e).__name__, str(e)[:1000]))
        answer.write(reply.replace("\\n", " ") + "\\n")
        answer.flush()
__treadle_serve()
"""

HARNESS = """
import ast, builtins, os, sys
ask = os.fdopen(int(os.environ["TREADLE_CHANNEL_OUT"]), "w")
answers = os.fdopen(int(os.environ["TREADLE_CHANNEL_IN"]), "r")

class Stub:
    def __init__(self, name):
        self.name = name
    def __repr__(self):
        return f"<function {self.name} of the code under test>"
    def __call__(self, *args, **kwargs):
        ask.write(repr((self.name, args, kwargs)).replace("\\n", " ") + "\\n")
        ask.flush()
        line = answers.readline()
        if not line:
            raise RuntimeError(f"the code under test ended before {self.name}() returned")
        try:
            reply = ast.literal_eval(line)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise TypeError(f"{self.name}() returned something that is not plain data: {line[:200]}")
        if reply[0] == "ok":
            return reply[1]
        kind = getattr(builtins, str(reply[1]), None)
        if isinstance(kind, type) and issubclass(kind, Exception):
            raise kind(reply[2])
        raise RuntimeError(f"{reply[1]}: {reply[2]}")

tree = ast.parse(TESTS, "tests")
bound = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
bound |= {a.asname or a.name.split(".")[0] for n in imports for a in n.names}
bound |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
bound |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - bound - set(dir(builtins))
namespace = {"__name__": "__main__", **{name: Stub(name) for name in used}}
exec(compile(tree, "tests", "exec"), namespace)
print("\\n" + VERDICT)  # on a line of its own, whatever the tests printed last
"""


@dataclasses.dataclass(frozen=True)
class Judged:
    passed: bool
    code: runner.Result
    """The response's run: its output is the response's own."""
    tests: runner.Result
    """The harness's run: a failing test's traceback is in its stderr."""

    @property
    def status(self) -> runner.Status:
        """The first run that did not end ``ok`` decides (the code's limits first), else ``ok``."""
        return self.code.status if not self.code.ok else self.tests.status

    @property
    def feedback(self) -> str:
        """What a model is shown: the failing test, else the code's errors, else its output."""
        return self.tests.stderr or self.code.stderr or self.code.stdout


def extract_code(text: str) -> str:
    """The last fenced block, or the whole text when there is none."""
    blocks = FENCE.findall(text)
    return str(blocks[-1]) if blocks else text


async def judge(sandbox: runner.Sandbox, response: str, tests: str, *, kind: str) -> Judged:
    """Run the response's code against ``tests``; passed only on the harness's own verdict."""
    harness = f"VERDICT = {VERDICT!r}\nTESTS = {tests!r}\n{HARNESS}"
    code, harness_run = await sandbox.run_connected(extract_code(response) + SERVE, harness, kind=kind)
    verdict = harness_run.ok and harness_run.stdout.rstrip("\n").rsplit("\n", 1)[-1] == VERDICT
    return Judged(passed=verdict, code=code, tests=harness_run)
