"""Run the worked example of lua/README.md (section 8) and check or rewrite its replies.

    python tests/readme_example.py --check   # exit 1 with a unified diff if a reply drifted
    python tests/readme_example.py --write   # paste the current replies into lua/README.md

Section 8 is a ```sh setup block (``R=``, ``K=``, ``T0=`` ...) followed by fenced blocks
of ``$ command`` lines, each followed by the reply redis-cli printed. This tool starts its
own redis-server on a unix socket in a temporary directory, runs every command in order
in one bash (so variables such as ``$SHA_enqueue`` carry over, as in a terminal) with the
repository root as the working directory, and compares what each printed (stdout and
stderr) with the lines under it.

How the README's setup maps onto the run:

* ``redis-server ... --unixsocket PATH ... &``, ``echo $! > ...``, ``cd ...`` and the
  closing ``kill`` block are what this tool does itself (start and stop its server by
  PID, run in the repository root); they are recognised, not run.
* ``PATH`` is replaced by the temporary socket in the setup and the commands, and the
  temporary socket by ``PATH`` in the replies, so a reply that names the socket reads
  as in the README. Nothing else in a reply is rewritten or masked: the example passes
  ``now_ms`` explicitly, so every reply is reproducible.
* Any other line in the setup block, or any other fenced block in section 8, is an
  error: everything shown in the section is either run or knowingly replaced.

Only the reply lines are rewritten by ``--write``; the commands, the prose and the rest
of the file stay byte for byte.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "lua" / "README.md"
HEADING = "## 8. Worked example (redis-cli)"
PROMPT = "$ "
#: The whole example must finish in this time (one hung command must not hang CI).
RUN_TIMEOUT_S = 60.0


class ExampleError(Exception):
    """Section 8 cannot be parsed or run (as opposed to: its replies differ)."""


@dataclass
class Command:
    """One ``$ `` command of the example and where its expected reply sits in the file."""

    text: str  # the command without the prompt; continuation lines joined with "\n"
    line: int  # 0-based index of its "$ " line, for messages
    start: int  # the expected reply is lines[start:end] of the file
    end: int

    def expected(self, lines: list[str]) -> list[str]:
        return lines[self.start:self.end]


@dataclass
class Example:
    """Section 8, parsed: the file's lines, the setup and the commands in order."""

    lines: list[str]
    socket: str  # the socket path the README's redis-server line uses
    assignments: list[str]  # the setup's NAME=value lines, verbatim
    commands: list[Command]


def _incomplete(command: str) -> bool:
    """Whether bash needs more lines to finish ``command`` (an open for/do, quote...).

    Asking bash itself, rather than guessing from indentation, because reply lines are
    indented too (`` 1) (integer) 1``) and a multi-line command's last line (``done``)
    is not.
    """
    check = subprocess.run(
        ["bash", "-n"], input=command, capture_output=True, text=True,
        env={**os.environ, "LC_ALL": "C"}, check=False,
    )
    return check.returncode != 0 and (
        "unexpected end of file" in check.stderr or "unexpected EOF" in check.stderr
    )


def _fenced_blocks(lines: list[str], begin: int) -> list[tuple[int, int]]:
    """(first, last) line indexes of the contents of every fenced block from ``begin``
    up to the next level-2 heading outside a fence."""
    blocks = []
    opened: int | None = None
    for i in range(begin, len(lines)):
        if lines[i].startswith("```"):
            if opened is None:
                opened = i + 1
            else:
                blocks.append((opened, i))
                opened = None
        elif opened is None and lines[i].startswith("## "):
            break
    if opened is not None:
        raise ExampleError(f"line {opened}: fenced block is never closed")
    return blocks


def _parse_setup(lines: list[str], first: int, last: int) -> tuple[str, list[str]]:
    """The README's socket path and the setup's variable assignments."""
    sock: str | None = None
    assignments = []
    for i in range(first, last):
        line = lines[i]
        if line.startswith("redis-server "):
            m = re.search(r"--unixsocket\s+(\S+)", line)
            if m is None:
                raise ExampleError(f"line {i + 1}: redis-server without --unixsocket")
            sock = m.group(1)
        elif re.match(r"(echo \$! > \S+|cd \S+)\s*(#.*)?$", line) or not line.strip():
            pass  # the tool tracks its server's PID itself and runs in the repository root
        elif re.match(r"[A-Za-z_][A-Za-z0-9_]*=", line):
            assignments.append(line)
        else:
            raise ExampleError(f"line {i + 1}: setup line this tool does not know: {line!r}")
    if sock is None:
        raise ExampleError(f"line {first}: setup block without a redis-server line")
    return sock, assignments


def _parse_commands(lines: list[str], first: int, last: int) -> list[Command]:
    """The commands of one ``$ `` block, each with the span of its expected reply."""
    commands = []
    i = first
    while i < last:
        if not lines[i].startswith(PROMPT):
            raise ExampleError(f"line {i + 1}: expected a '$ ' command, got {lines[i]!r}")
        at = i
        text = lines[i][len(PROMPT):]
        while _incomplete(text):
            i += 1
            if i == last or lines[i].startswith(PROMPT):
                raise ExampleError(f"line {at + 1}: command is not complete before the next '$ ' or the block's end")
            text += "\n" + lines[i]
        i += 1
        start = i
        while i < last and not lines[i].startswith(PROMPT):
            i += 1
        end = i
        while end > start and not lines[end - 1].strip():
            end -= 1  # the blank line before the next command separates, it is not reply
        commands.append(Command(text, at, start, end))
    return commands


def parse(text: str) -> Example:
    """Parse section 8 of the README text; raise ExampleError on anything unrecognised."""
    lines = text.split("\n")
    try:
        begin = lines.index(HEADING)
    except ValueError:
        raise ExampleError(f"no line {HEADING!r}") from None
    sock: str | None = None
    assignments: list[str] = []
    commands: list[Command] = []
    for first, last in _fenced_blocks(lines, begin + 1):
        body = [line for line in lines[first:last] if line.strip()]
        if body and body[0].startswith(PROMPT):
            commands += _parse_commands(lines, first, last)
        elif any(line.startswith("redis-server ") for line in body):
            if sock is not None:
                raise ExampleError(f"line {first}: a second setup block")
            sock, assignments = _parse_setup(lines, first, last)
        elif body and all(line.startswith("kill ") for line in body):
            pass  # stopping the server: the tool stops its own by PID
        else:
            raise ExampleError(f"line {first}: fenced block that is neither setup, '$ ' commands nor kill")
    if sock is None:
        raise ExampleError("section 8 has no setup block")
    return Example(lines, sock, assignments, commands)


def _ping(path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1)
            s.connect(path)
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start_server(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A fresh redis-server on a unix socket in ``directory`` (no TCP, no persistence)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ExampleError("redis-server is not installed")
    path = str(directory / "redis.sock")
    process = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", path, "--unixsocketperm", "700",
         "--dir", str(directory), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not _ping(path):
        if time.monotonic() > deadline or process.poll() is not None:
            _stop(process)
            raise ExampleError("redis-server did not start")
        time.sleep(0.02)
    return process, path


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def server_version() -> str:
    """``redis-server --version``'s v=..., for the diff header (replies differ by version)."""
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"v=(\S+)", out)
    return m.group(1) if m else "unknown"


def run(example: Example) -> list[list[str]]:
    """Run every command on a fresh server; return what each printed, as lines."""
    if shutil.which("redis-cli") is None:
        raise ExampleError("redis-cli is not installed")
    with tempfile.TemporaryDirectory(prefix="pyqueue-readme-") as tmp:
        directory = Path(tmp)
        server, sock = _start_server(directory)
        try:
            return _run_commands(example, directory, sock)
        finally:
            _stop(server)


def _run_commands(example: Example, directory: Path, sock: str) -> list[list[str]]:
    # One bash for the whole example, so the SHA_* variables set by the load loop reach
    # the later commands. Each command is eval'd from its own file: a syntax error in
    # one then fails that command alone (its message is its reply) instead of the shell.
    driver = ["set -a"]  # export the setup variables: a command may start another bash
    driver += [line.replace(example.socket, sock) for line in example.assignments]
    driver.append("set +a")
    for n, command in enumerate(example.commands):
        (directory / f"{n}.sh").write_text(command.text.replace(example.socket, sock))
        script, output = (shlex.quote(str(directory / f"{n}.{ext}")) for ext in ("sh", "out"))
        driver.append(f'eval "$(< {script})" < /dev/null > {output} 2>&1')
    env = {**os.environ, "LC_ALL": "C"}
    env.pop("REDISCLI_AUTH", None)  # would make redis-cli AUTH against our password-less server
    # bash -c with $0 = "bash": a command's error reads "bash: ..." as in a terminal, with
    # no temporary path in it.
    process = subprocess.Popen(
        ["bash", "-c", "\n".join(driver), "bash"], cwd=ROOT, env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so a timeout stops it and its children
    )
    try:
        own_output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        ran = sum(1 for n in range(len(example.commands)) if (directory / f"{n}.out").exists())
        stuck = example.commands[max(ran - 1, 0)]
        raise ExampleError(f"timed out after {RUN_TIMEOUT_S:.0f} s in the command on line {stuck.line + 1}") from None
    if own_output:
        raise ExampleError("the setup failed:\n" + own_output.decode(errors="replace"))
    replies = []
    for n, command in enumerate(example.commands):
        out = directory / f"{n}.out"
        if not out.exists():
            raise ExampleError(f"line {command.line + 1}: not run (an earlier command ended the shell)")
        text = out.read_bytes().decode(errors="backslashreplace").replace(sock, example.socket)
        lines = text.split("\n")
        while lines and not lines[-1].strip():
            lines.pop()  # trailing blank lines cannot be told from the separator in the README
        for line in lines:
            if line.startswith((PROMPT, "```")):
                raise ExampleError(f"line {command.line + 1}: a reply line reads like markup: {line!r}")
        replies.append(lines)
    return replies


def render(example: Example, replies: list[list[str]]) -> str:
    """The file's text with every expected reply replaced by ``replies``."""
    lines = list(example.lines)
    for command, reply in reversed(list(zip(example.commands, replies, strict=True))):
        lines[command.start:command.end] = reply
    return "\n".join(lines)


def read(path: Path) -> str:
    # newline="": keep the file's line endings as they are, so --write touches only replies.
    with path.open(encoding="utf-8", newline="") as f:
        return f.read()


def diff(path: Path = README) -> str:
    """A unified diff from the README's replies to the current ones; empty if none drifted."""
    text = read(path)
    example = parse(text)
    fresh = render(example, run(example))
    return "".join(difflib.unified_diff(
        text.splitlines(keepends=True), fresh.splitlines(keepends=True),
        fromfile=f"{os.path.relpath(path, ROOT)} (as written)",
        tofile=f"{os.path.relpath(path, ROOT)} (replies of redis-server {server_version()})",
    ))


def write(path: Path = README) -> bool:
    """Paste the current replies into ``path``; return whether anything changed."""
    text = read(path)
    example = parse(text)
    fresh = render(example, run(example))
    if fresh == text:
        return False
    # Others edit this file too: refuse to overwrite an edit made while the example ran.
    if read(path) != text:
        raise ExampleError(f"{path} changed while the example ran; run --write again")
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write(fresh)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff if a reply drifted")
    mode.add_argument("--write", action="store_true", help="rewrite the replies in lua/README.md")
    args = parser.parse_args(argv)
    try:
        if args.write:
            print(f"{README.relative_to(ROOT)}: " + ("replies updated" if write() else "up to date"))
            return 0
        drift = diff()
    except ExampleError as e:
        print(f"readme_example: {e}", file=sys.stderr)
        return 2
    if drift:
        sys.stdout.write(drift)
        print("\nThe worked example drifted; run: python tests/readme_example.py --write", file=sys.stderr)
        return 1
    print(f"{README.relative_to(ROOT)}: worked example up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
