"""``manage.py runqueueworker`` child processes for tests: each uses the test's database
(``child_env``), writes its output to files, and is killed when the test ends."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 180


class Child:
    """A ``runqueueworker`` child process with its output in files."""

    def __init__(self, env: dict[str, str], tmp: Path, *args: str, name: str = "w") -> None:
        self.out = tmp / f"{name}.out"
        self.err = tmp / f"{name}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "django", "runqueueworker", *args],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=err,
                text=True,
            )

    def wait(self) -> int:
        try:
            return self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def output(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


#: the ``children`` fixture (tests/process/conftest.py): start a child with these arguments
Start = Callable[..., Child]
