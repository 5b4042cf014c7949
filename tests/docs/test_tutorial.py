"""docs/tutorial/first-app.md runs as written: its files, its commands, the output it shows.

The page is read with the conventions below, which keep it plain Markdown that MkDocs Material
renders cleanly (a fence's ``title`` is shown as a caption above the block):

- **A file** is a fenced block whose opening line gives a title naming its path (the fence
  opens with ``python title="orders.py"``); the test writes it to that path in a fresh project
  folder. The page's project layout (its one ``text`` block) lists exactly these files.
- **A terminal** is a fenced block opened with ``console title="terminal N"``. Each line
  starting with ``$ `` is a command typed there; the lines after it, up to the next command,
  are its output. A block without a command shows output that appears later in a terminal
  already running something; ``title="terminal 3 or 6"`` means in one of the two.
- ``<!-- not run: REASON -->`` on the line above a block leaves it out (installing packages,
  ``dex dev``). Every other console block is run, in the page's order, and the test counts
  them: a block added to the page is run or visibly left out, never skipped in silence.
- In output, ``…`` stands for any text (ids, times), a run of spaces counts as one, and
  ``pid N`` for the pid of whichever process printed it: ``kill -9 N`` later in the page
  kills that very process.

How the commands run, and what differs from a reader's machine:

- ``dex``, ``uvicorn`` and ``pytest`` run as ``python -P -m ...`` with this interpreter, and
  ``PYTHONPATH`` naming this checkout, so the repository's own dex is the one under test
  (``-P``: as with the console scripts, Python puts no directory on ``sys.path`` itself).
  ``pytest`` runs without this environment's plugins (hypothesis, schemathesis), which a
  reader's has not.
- ``DEX_DATABASE_URL`` names a database of this test's on the test server (the page gets it
  from ``dex dev``): the page's code uses dex's default schema, so a database the test holds
  alone (see ``database`` below) is what keeps it apart from any other test.
- The page's ports are swapped for free ones, in commands and output alike (the machine is
  shared), and ``PAYMENTS_URL`` tells ``orders.py`` where the payment service went.
- ``curl`` is done with urllib. A ``GET`` is repeated until it answers what the page shows
  (the page shows what the reader sees a few seconds later); a ``POST`` is sent once.
- A command that keeps running (``uvicorn``, ``dex worker``, ``dex web``) is ready when the
  output the page shows for it has appeared. A new command in a terminal whose process still
  runs comes after a Ctrl-C (SIGINT) of that process, as the page tells the reader.
- Output blocks are matched against the terminals' processes that are still alive.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import psycopg
import pytest
from psycopg import sql

from tests.pg import postgres_dsn

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorial" / "first-app.md"

# what the page holds: changing it means changing these, so no block goes unnoticed
FILES = ("payments.py", "orders.py", "app.py", "test_orders.py")
RUN_BLOCKS = 17
NOT_RUN_BLOCKS = 3
COMMANDS = 14

WAIT = 30.0  # seconds any one step of the page may take

FENCE = re.compile(
    r"^(?:<!-- not run: (?P<reason>.+?) -->\n)?"
    r"```(?P<lang>\w+)(?: title=\"(?P<title>[^\"]+)\")?\n(?P<body>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
PID = re.compile(r"pid (\d+)")
PORT = re.compile(r"(?<=127\.0\.0\.1:)(\d+)|(?<=--port )(\d+)")


@attrs.frozen
class Block:
    lang: str
    title: str | None
    body: str
    not_run: str | None  # the reason, for a block the test leaves out


def blocks() -> list[Block]:
    text = PAGE.read_text(encoding="utf-8")
    return [Block(match["lang"], match["title"], match["body"], match["reason"]) for match in FENCE.finditer(text)]


def files() -> dict[str, str]:
    return {block.title: block.body for block in blocks() if block.lang == "python" and block.title}


def terminal_blocks() -> list[Block]:
    return [block for block in blocks() if block.lang == "console"]


def test_the_page_is_files_and_terminals() -> None:
    page = blocks()
    assert all(block.title for block in page if block.lang in ("python", "console")), "a block without a title"
    assert tuple(files()) == FILES
    console = terminal_blocks()
    assert sum(block.not_run is None for block in console) == RUN_BLOCKS
    assert sum(block.not_run is not None for block in console) == NOT_RUN_BLOCKS
    commands = [line for block in console if block.not_run is None for line in block.body.splitlines()]
    assert sum(line.startswith("$ ") for line in commands) == COMMANDS
    (layout,) = (block.body for block in page if block.lang == "text")
    assert re.findall(r"[├└]── (\S+)", layout) == list(FILES)


# -- matching output ---------------------------------------------------------------------------


def normalized(line: str) -> str:
    return " ".join(line.split())


def pattern_of(line: str) -> re.Pattern[str]:
    """The regular expression of one line of shown output: ``…`` any text, ``pid N`` any pid."""
    parts = []
    for piece in re.split(r"(…|pid \d+)", normalized(line)):
        if piece == "…":
            parts.append(".*?")
        elif PID.fullmatch(piece):
            parts.append(r"pid (\d+)")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


class Pids:
    """The page's pids and the real ones they stand for: the same page pid is the same process."""

    def __init__(self) -> None:
        self.real: dict[int, int] = {}

    def match(self, shown: list[str], actual: list[str]) -> dict[int, int] | None:
        """The page pids the shown lines map, when they are found in order among ``actual``; else None."""
        found: dict[int, int] = {}
        position = 0
        for line in shown:
            pattern = pattern_of(line)
            page_pid = PID.search(line)
            while position < len(actual):
                candidate = pattern.fullmatch(normalized(actual[position]))
                position += 1
                if candidate is None:
                    continue
                if page_pid is None:
                    break
                shown_pid, real = int(page_pid[1]), int(candidate[1])
                if found.get(shown_pid, self.real.get(shown_pid, real)) == real:
                    found[shown_pid] = real
                    break
            else:
                return None
        return found

    def take(self, found: dict[int, int]) -> None:
        self.real.update(found)


# -- the terminals ---------------------------------------------------------------------------


@attrs.define
class Process:
    command: str
    popen: subprocess.Popen[bytes]
    log: Path

    def lines(self) -> list[str]:
        return self.log.read_text(encoding="utf-8", errors="replace").splitlines()

    def alive(self) -> bool:
        return self.popen.poll() is None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(what: str, check: Callable[[], bool], describe: Callable[[], str]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{describe()}")
        time.sleep(0.1)


class Tutorial:
    """Runs the page's terminal blocks in order, as a reader types them."""

    def __init__(self, project: Path, env: dict[str, str], ports: dict[str, str]) -> None:
        self.project, self.env, self.ports = project, env, ports
        self.terminals: dict[str, Process] = {}
        self.pids = Pids()
        self.commands = 0
        self.blocks = 0

    def localized(self, text: str) -> str:
        return PORT.sub(lambda match: self.ports.get(match[0], match[0]), text)

    def run(self, block: Block) -> None:
        assert block.title is not None
        names = re.findall(r"\d+", block.title)
        lines = self.localized(block.body).splitlines()
        self.blocks += 1
        if not any(line.startswith("$ ") for line in lines):
            self.shown_in_one_of(names, lines)
            return
        (terminal,) = names
        assert lines[0].startswith("$ "), f"output before the first command of {block.title}: {lines[0]}"
        while lines:
            command = lines.pop(0)[2:]
            output = []
            while lines and not lines[0].startswith("$ "):
                output.append(lines.pop(0))
            self.commands += 1
            self.type(terminal, command, output)

    def describe(self) -> str:
        return "\n".join(
            f"--- terminal {name}: {process.command} ({'running' if process.alive() else process.popen.returncode})\n"
            + "\n".join(process.lines()[-30:])
            for name, process in self.terminals.items()
        )

    def shown_in_one_of(self, names: list[str], shown: list[str]) -> None:
        def appeared() -> bool:
            for name in names:
                process = self.terminals.get(name)
                if process is not None and process.alive():
                    found = self.pids.match(shown, process.lines())
                    if found is not None:
                        self.pids.take(found)
                        return True
            return False

        wait_until(f"{shown} in terminal {' or '.join(names)}", appeared, self.describe)

    def type(self, terminal: str, command: str, output: list[str]) -> None:
        words = shlex.split(command)
        if words[0] == "curl":
            self.curl(words[1:], output)
        elif words[0] == "kill":
            self.kill(words[1:])
        elif words[0] == "pytest":
            self.run_tests(words, output)
        elif words[0] == "uvicorn" or words[:2] in (["dex", "worker"], ["dex", "web"]):
            self.start(terminal, command, words, output)
        else:
            pytest.fail(f"the test does not know how to run {command!r}: teach it, or mark the block not run")

    def python(self, words: list[str]) -> list[str]:
        return [sys.executable, "-P", "-m", *words]

    def start(self, terminal: str, command: str, words: list[str], output: list[str]) -> None:
        previous = self.terminals.get(terminal)
        if previous is not None and previous.alive():  # the reader's Ctrl-C
            previous.popen.send_signal(signal.SIGINT)
            # it stops: dex worker, dex web and uvicorn exit 0
            assert previous.popen.wait(timeout=WAIT) == 0, self.describe()
        log = self.project / f"terminal-{terminal}-{len(self.terminals)}.log"
        with open(log, "wb") as sink:
            popen = subprocess.Popen(
                self.python(words),
                cwd=self.project,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        process = Process(command, popen, log)
        self.terminals[terminal] = process

        def ready() -> bool:
            assert process.alive(), f"{command!r} exited\n{self.describe()}"
            found = self.pids.match(output, process.lines())
            if found is not None:
                self.pids.take(found)
            return found is not None

        wait_until(f"{command!r} to print {output}", ready, self.describe)
        if words[:2] == ["dex", "web"]:
            self.dashboard_shows_the_first_order(process)

    def dashboard_shows_the_first_order(self, web: Process) -> None:
        """What the page says of the dashboard beyond its output: it shows the run of A-1, done."""
        (url,) = (m[1] for line in web.lines() if (m := re.search(r"dashboard at (\S+)", line)))
        with urllib.request.urlopen(f"{url}v1/runs?instance_id=A-1", timeout=WAIT) as response:
            (run,) = json.load(response)["runs"]
        assert (run["workflow_name"], run["status"]) == ("order", "COMPLETED"), run
        with urllib.request.urlopen(f"{url}runs/{run['run_id']}", timeout=WAIT) as response:
            page = response.read().decode()
        assert "charge-card" in page and "packed" in page and "parcel-A-1" in page

    def run_tests(self, words: list[str], output: list[str]) -> None:
        # without the plugins of this test environment (hypothesis, schemathesis...), which a
        # reader's has not: loading them took five of the test's seconds
        env = {**self.env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        result = subprocess.run(
            self.python(words), cwd=self.project, env=env, capture_output=True, text=True, timeout=WAIT * 2
        )
        printed = result.stdout + result.stderr
        assert result.returncode == 0, printed
        assert self.pids.match(output, printed.splitlines()) is not None, printed

    def curl(self, words: list[str], output: list[str]) -> None:
        method, data, url = "GET", None, None
        while words:
            word = words.pop(0)
            if word == "-s":
                continue
            if word == "-X":
                method = words.pop(0)
            elif word == "-d":
                data = words.pop(0).encode()
            else:
                assert url is None and not word.startswith("-"), f"curl option the test does not know: {word}"
                url = word if "://" in word else f"http://{word}"
        assert url is not None
        (shown,) = output
        pattern = pattern_of(shown)

        def answer() -> str:
            request = urllib.request.Request(url, data=data, method=method)
            with urllib.request.urlopen(request, timeout=WAIT) as response:
                return str(response.read().decode())

        if method != "GET":  # sent once: a second "packed" would be a second event
            answered = answer()
            assert pattern.fullmatch(normalized(answered)), f"{method} {url}: {answered!r}, not {shown!r}"
            return
        answers: list[str] = []
        wait_until(
            f"GET {url} to answer {shown}",
            lambda: bool(answers.append(answer()) or pattern.fullmatch(normalized(answers[-1]))),
            lambda: f"it last answered {answers[-1:]}\n{self.describe()}",
        )

    def kill(self, words: list[str]) -> None:
        assert words[0] == "-9", words
        real = self.pids.real[int(words[1])]  # the process that printed that pid on the page
        (process,) = (p for p in self.terminals.values() if p.popen.pid == real and p.alive())
        process.popen.send_signal(signal.SIGKILL)
        assert process.popen.wait(timeout=WAIT) == -signal.SIGKILL

    def close(self) -> None:
        for process in self.terminals.values():
            if process.alive():
                process.popen.terminate()
        for process in self.terminals.values():
            try:
                process.popen.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()


SLOTS = 8  # test processes that may run the page at once on one server
LOCK_CLASS = 0x7475  # the advisory lock keys (LOCK_CLASS, slot) that hold the slots


def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS dex CASCADE")  # the page's code uses the default schema


def take_slot(holder: psycopg.Connection[tuple[object, ...]]) -> int:
    """The first slot no other test process holds, held by ``holder``'s session from now on."""
    for slot in range(SLOTS):
        if holder.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, slot)).fetchone() == (True,):
            return slot
    pytest.fail(f"all {SLOTS} databases of the tutorial's test are taken")


@pytest.fixture
def database() -> Iterator[str]:
    """A database on the test server for the page's code, which uses dex's default schema.

    One of a few kept for this test (``dex_tutorial_0``, ``_1``, ...): the test holds its slot
    with an advisory lock, so two test processes never share one, and drops its schema before
    and after. The databases are kept rather than dropped: DROP DATABASE waits for a checkpoint,
    which took 10 to 16 s on a shared server, where DROP SCHEMA takes milliseconds.
    """
    server = postgres_dsn()
    with psycopg.connect(server, autocommit=True) as holder:  # the locks last as long as it does
        slot = take_slot(holder)
        name = f"dex_tutorial_{slot}"
        if holder.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            try:
                holder.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            except psycopg.errors.InsufficientPrivilege:
                pytest.fail(f"the tutorial's test needs a database of its own: {server!r} may not CREATE DATABASE")
        dsn = psycopg.conninfo.make_conninfo(server, dbname=name)
        reset(dsn)  # a run that was killed may have left its runs
        try:
            yield dsn
        finally:
            reset(dsn)


@pytest.mark.postgres
def test_the_tutorial_runs_as_written(tmp_path: Path, database: str) -> None:
    project = tmp_path / "shop"
    project.mkdir()
    for path, source in files().items():
        (project / path).write_text(source, encoding="utf-8")
    page_ports = sorted(
        {
            port
            for block in terminal_blocks()
            if block.not_run is None
            for port in re.findall(r"--port (\d+)", block.body)
        }
    )
    ports = {port: str(free_port()) for port in page_ports}
    (payments_port,) = re.findall(r'"http://127\.0\.0\.1:(\d+)"', files()["orders.py"])
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DEX_DATABASE_URL": database,
        "PAYMENTS_URL": f"http://127.0.0.1:{ports[payments_port]}",
    }
    tutorial = Tutorial(project, env, ports)
    try:
        for block in terminal_blocks():
            if block.not_run is None:
                tutorial.run(block)
    finally:
        tutorial.close()
    assert (tutorial.blocks, tutorial.commands) == (RUN_BLOCKS, COMMANDS)
    killed = [p for p in tutorial.terminals.values() if p.popen.returncode == -signal.SIGKILL]
    assert len(killed) == 1 and "shipped A-2" not in killed[0].lines()
    survivors = [p for p in tutorial.terminals.values() if "shipped A-2" in p.lines()]
    assert len(survivors) == 1 and survivors[0] is not killed[0]
    # "its charge and timer not repeated": the payment service saw two tries per order, no more
    charges = [line for line in tutorial.terminals["2"].lines() if "POST /charges" in line]
    assert [line.rpartition('" ')[2] for line in charges] == ["503 Service Unavailable", "200 OK"] * 2
