"""Run untrusted, model-written Python in a separate, contained process: :func:`run_python`.

What is contained, and by what:

* **Process**: a fresh ``python -I -S -B -X utf8`` (isolated mode: no ``PYTHON*`` variables, no
  site-packages, no script directory on ``sys.path``, no byte-code written) in its own session
  (``start_new_session``), so the whole process group can be killed. The parent never blocks: it
  reads stdout/stderr/the violation pipe with ``select`` and a deadline, kills the group on the
  wall-clock limit or when an output passes ``max_output_bytes`` (the kept part is returned and
  the run flagged), and keeps at most that many bytes in memory.
* **Resources** (rlimits set by the child before any user code, hard = soft so they cannot be
  raised): ``RLIMIT_CPU`` (SIGXCPU, then SIGKILL a second later), ``RLIMIT_AS`` (memory_mb),
  ``RLIMIT_FSIZE`` (max_file_bytes), ``RLIMIT_NOFILE`` (32), ``RLIMIT_CORE`` 0 and, with
  ``max_processes`` 0, ``RLIMIT_NPROC`` 0. The parent also caps the work dir at
  :data:`WORKDIR_MAX_ENTRIES` entries and ``WORKDIR_MAX_FILES_BYTES`` x max_file_bytes in total
  (checked every :data:`POLL_S`; many small files would otherwise fill a RAM-backed /tmp).
* **Environment**: an empty environment (no inherited variables or secrets; the interpreter adds
  only ``LC_CTYPE=C.UTF-8`` itself, PEP 538); cwd is a fresh temporary work dir (mode 0700),
  deleted afterwards together with the program (``main.py``) and its stdin file.
* **Operations**: an audit hook (``sys.addaudithook``, see :mod:`._runner`) installed before the
  program runs fails closed: the first forbidden operation is written to a dedicated pipe the parent
  reads and the process exits at once (``os._exit``), so catching the exception cannot hide it, and
  the run's status is ``"violation"``. Forbidden: network (every ``socket.*`` event, socket/ssl
  imports), process creation (fork, exec*, system, spawn, posix_spawn, subprocess; fork and threads
  only with ``max_processes`` > 0, counted by tokens from a parent pipe; exec never, as a new image
  would run without the hook), signalling other processes (``os.kill``, ``killpg``,
  ``pthread_kill``, ``pidfd_send_signal``) and installing signal handlers, opening a file for
  writing outside the work dir, opening for reading anything outside the work dir and the
  interpreter's own stdlib folders (plus /dev/null and /dev/urandom), opening directories (no dir
  fds, so no ``dir_fd`` tricks), remove/rename/chmod/mkdir/... outside the work dir, symlinks and
  hard links, ctypes and native libraries other than the stdlib's own extension modules,
  sub-interpreters, raising rlimits, adding audit hooks, tracing/profiling hooks, gc referrer
  walks, building code objects or unmarshalling code (crafted byte-code can corrupt memory),
  replacing a function's ``__code__``/``__defaults__``. Functions that raise no audit event in
  3.11 (``mknod``, ``mkfifo``, ``chroot``, ``signal.signal``, ``pidfd_send_signal``,
  ``_imp.create_builtin``, thread start) are replaced by C-level guards before the program starts.

Statuses: ``ok``; ``error`` (exception or non-zero exit); ``timeout`` (wall clock or CPU limit);
``memory`` (MemoryError under ``RLIMIT_AS``); ``violation`` (any forbidden attempt, even if the
program then exited 0); ``output_limit`` (stdout/stderr over ``max_output_bytes``, a file write
over ``max_file_bytes``, or the work dir over its quota). Precedence: violation > output_limit >
timeout > memory > error > ok.

Known limits (an audit hook is not a security boundary by itself; this is defence in depth):

* Everything runs as the trainer's user. As root, ``RLIMIT_NPROC`` is ignored (the hook is then
  the only fork barrier) and a memory-corruption bug in CPython or a C extension module reached
  from pure Python would let a program drop the hook and act with the user's full rights. rlimits,
  the empty environment, the temporary cwd and the process-group kill still apply.
* Metadata is not hidden: ``os.stat``/``os.access``/``os.readlink`` raise no audit event, so a
  program can probe whether paths exist. C code in allowed stdlib modules may read files without
  an event (e.g. time-zone or locale data).
* With ``max_processes`` > 0, a forked child can ``setsid`` out of the process group and outlive
  the wall-clock kill (still bound by its CPU limit), and concurrent processes can race the hook's
  path checks (check-then-open).
* Imports in the sandbox compile from source (no ``.pyc``), so a run that imports ``re`` or
  ``collections`` costs tens of ms more (a bare run costs about 20 ms).
* Opening a directory is refused everywhere (a directory fd would let ``dir_fd=`` paths escape the
  hook's path checks), so fd-based helpers such as ``shutil.rmtree``/``os.fwalk`` fail even inside
  the work dir; path objects (``pathlib.Path``) passed straight to ``open``/``os.*`` are refused
  too (their ``__fspath__`` could answer the hook differently), while pathlib's own methods work.

For hostile code in production, run this inside a container or nsjail/bubblewrap (no network
namespace, read-only root, separate unprivileged user, cgroup memory/pids limits).
"""

from __future__ import annotations

import contextlib
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from nemo_azr.config.schema import SandboxLimitsConfig
from nemo_azr.envs.python_exec._runner import EXIT_FSIZE, EXIT_MEMORY, EXIT_VIOLATION
from nemo_azr.envs.python_exec.pool import LIMITER

STATUSES = ("ok", "error", "timeout", "memory", "violation", "output_limit")
POLL_S = 0.05  # how often the parent checks the work dir quota while the program runs
WORKDIR_MAX_ENTRIES = 256  # files + folders the program may create
WORKDIR_MAX_FILES_BYTES = 16  # total size of the work dir, in units of max_file_bytes
MAX_VIOLATION_BYTES = 16384  # violation-pipe bytes kept (each line is at most ~300 characters)
MAX_VIOLATIONS = 20  # distinct violation lines reported
_REAP_GRACE_S = 5.0  # after a SIGKILL of the group, how long to wait for the child to be reaped
_RUNNER_SOURCE = (Path(__file__).with_name("_runner.py")).read_text(encoding="utf-8")


@dataclass
class SandboxResult:
    """The outcome of one :func:`run_python` call."""

    status: str  # one of STATUSES
    stdout: str
    stderr: str
    returncode: int | None  # negative: killed by that signal; None: it could not be started
    violations: list[str] = field(default_factory=list)  # each forbidden attempt, e.g. "socket.connect"
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class _Stream:
    """One pipe from the child: the bytes kept and whether more arrived than the cap."""

    cap: int
    data: bytearray = field(default_factory=bytearray)
    over: bool = False

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if len(chunk) > room:
            self.over = True
        self.data += chunk[: max(room, 0)]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def run_python(code: str, *, stdin: str = "", limits: SandboxLimitsConfig | None = None) -> SandboxResult:
    """Run ``code`` as a program in the sandbox with ``stdin`` as its standard input.

    Never raises for anything the program does; a failure to start the interpreter is returned as
    status ``"error"`` with ``returncode`` None.
    """
    limits = limits if limits is not None else SandboxLimitsConfig()
    base = tempfile.mkdtemp(prefix="azr-sbx-")
    fds: list[int] = []
    try:
        work = os.path.join(base, "work")
        os.mkdir(work, 0o700)
        # lone surrogates (possible in decoded model text) would not encode: replace them
        Path(work, "main.py").write_text(code, encoding="utf-8", errors="replace")
        stdin_path = os.path.join(base, "stdin")  # outside the work dir: the program only reads fd 0
        Path(stdin_path).write_text(stdin, encoding="utf-8", errors="replace")
        vr, vw = os.pipe()  # violation lines, child -> parent
        tr, tw = os.pipe()  # one token per process the program may start
        fds += [vr, vw, tr, tw]
        if limits.max_processes > 0:
            os.write(tw, b"p" * min(limits.max_processes, 4096))
        os.close(tw)
        fds.remove(tw)
        argv = [
            sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", _RUNNER_SOURCE,
            str(vw), str(tr), str(max(1, math.ceil(limits.cpu_time_s))),
            str(int(limits.memory_mb * 1024 * 1024)), str(int(limits.max_file_bytes)), str(int(limits.max_processes)),
        ]  # fmt: skip
        with LIMITER.slot():  # bounded concurrency (pool.py); the limits start with the child
            started = time.monotonic()
            try:
                with open(stdin_path, "rb") as fin:
                    proc = subprocess.Popen(
                        argv, stdin=fin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work, env={},
                        pass_fds=(vw, tr), start_new_session=True, close_fds=True,
                    )  # fmt: skip
            except OSError as exc:
                return SandboxResult("error", "", f"sandbox could not start: {exc}", None, [], 0.0)
            for fd in (vw, tr):  # the child holds its own copies
                os.close(fd)
                fds.remove(fd)
            return _supervise(proc, vr, limits, work, started)
    finally:
        for fd in fds:
            os.close(fd)
        _remove_tree(base)


def _supervise(
    proc: subprocess.Popen, vr: int, limits: SandboxLimitsConfig, work: str, started: float
) -> SandboxResult:
    """Read the child's pipes until they close or a limit is hit, then reap it and classify."""
    assert proc.stdout is not None and proc.stderr is not None
    cap = max(0, limits.max_output_bytes)
    out, err, viol = _Stream(cap), _Stream(cap), _Stream(MAX_VIOLATION_BYTES)
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err, vr: viol}
    deadline = started + limits.wall_time_s
    timed_out = over_quota = False
    with selectors.DefaultSelector() as sel:
        for fd in streams:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        next_quota = started + POLL_S
        while sel.get_map() and not (out.over or err.over or over_quota):
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            for key, _ in sel.select(min(deadline - now, POLL_S)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if chunk:
                    streams[key.fd].add(chunk)
                else:
                    sel.unregister(key.fd)
            if time.monotonic() >= next_quota:
                next_quota = time.monotonic() + POLL_S
                over_quota = _over_quota(work, limits)
    killed = timed_out or out.over or err.over or over_quota
    if killed:
        _kill_group(proc.pid)
    returncode, late = _reap(proc, deadline)
    timed_out |= late
    over_quota |= _over_quota(work, limits)
    with contextlib.suppress(OSError):  # what the child wrote just before exiting may still be there
        viol.add(os.read(vr, MAX_VIOLATION_BYTES))
    proc.stdout.close()
    proc.stderr.close()
    violations = _violation_lines(viol.text())
    if returncode == EXIT_VIOLATION and not violations:
        violations = ["unrecorded violation (the report pipe was tampered with)"]
    status = _classify(
        returncode, err.text(), violations, out.over or err.over or over_quota, timed_out, killed
    )
    return SandboxResult(status, out.text(), err.text(), returncode, violations, time.monotonic() - started)


def _classify(
    returncode: int | None, stderr: str, violations: list[str], over: bool, timed_out: bool, killed: bool
) -> str:
    """The status, by the precedence in the module docstring."""
    if violations:
        return "violation"
    if over or returncode == EXIT_FSIZE:
        return "output_limit"
    # SIGXCPU at the soft CPU limit; a SIGKILL we did not send is the hard CPU limit (the program
    # blocked SIGXCPU) or, rarely, the kernel's OOM killer
    if timed_out or returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and not killed):
        return "timeout"
    if returncode == EXIT_MEMORY or (returncode not in (0, None) and "MemoryError" in stderr[-2000:]):
        return "memory"
    return "ok" if returncode == 0 else "error"


def _violation_lines(text: str) -> list[str]:
    lines: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line and line not in lines:
            lines.append(line)
    return lines[:MAX_VIOLATIONS]


def _kill_group(pid: int) -> None:
    """SIGKILL the child's process group. Only called before the child is reaped, so its pid (the
    group id) cannot have been reused by an unrelated process."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _reap(proc: subprocess.Popen, deadline: float) -> tuple[int | None, bool]:
    """Wait (until ``deadline``) for the child to exit, kill what is left of its group, reap it.

    Returns the return code and whether the deadline passed first. ``waitid(WNOWAIT)`` leaves the
    exited child a zombie, so the group id stays reserved for the final ``killpg``.
    """
    late = False
    if hasattr(os, "waitid"):
        while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() >= deadline:
                late = True
                break
            time.sleep(0.001)
    else:  # pragma: no cover - platforms without waitid
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            late = True
    _kill_group(proc.pid)  # stragglers (forked children), and the child itself when late
    try:
        return proc.wait(timeout=_REAP_GRACE_S), late
    except subprocess.TimeoutExpired:  # pragma: no cover - an unkillable (D-state) process
        return None, late


def _over_quota(work: str, limits: SandboxLimitsConfig) -> bool:
    """Whether the work dir holds more entries or bytes than the program may create."""
    max_bytes = WORKDIR_MAX_FILES_BYTES * max(1, limits.max_file_bytes)
    entries, total, todo = 0, 0, [work]
    while todo:
        try:
            with os.scandir(todo.pop()) as it:
                for entry in it:
                    entries += 1
                    st = entry.stat(follow_symlinks=False)
                    total += st.st_size
                    if stat.S_ISDIR(st.st_mode):
                        todo.append(entry.path)
                    if entries > WORKDIR_MAX_ENTRIES + 1 or total > max_bytes:  # +1: main.py
                        return True
        except OSError:
            continue
    return False


def _remove_tree(path: str) -> None:
    """Delete the run's temporary folder, even if the program made parts of it unreadable."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    todo = [path]
    while todo:  # give every folder back its owner's permissions, then try again
        d = todo.pop()
        try:
            os.chmod(d, 0o700)
            with os.scandir(d) as it:
                todo += [e.path for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
    shutil.rmtree(path, ignore_errors=True)
