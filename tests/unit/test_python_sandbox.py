"""python_exec sandbox: hostile programs are contained and reported with the right status, the
parent (this test process) and the files outside the work dir survive, normal programs still work.

Each expectation is independent of the sandbox's own code: files are checked on disk, secrets are
planted in this process's environment, a real listening socket checks that nothing connected, and
statuses follow the documented mapping (forbidden operation -> violation, RLIMIT_AS -> memory,
CPU/wall limit -> timeout, output or file size cap -> output_limit, exception -> error).
"""

from __future__ import annotations

import dis
import os
import signal
import socket
import sysconfig
import tempfile
import textwrap
import time

import pytest

from nemo_azr.config.schema import SandboxLimitsConfig
from nemo_azr.envs.python_exec import _runner
from nemo_azr.envs.python_exec.sandbox import run_python

FAST = SandboxLimitsConfig(cpu_time_s=1, wall_time_s=3.0)
WALL = SandboxLimitsConfig(cpu_time_s=5, wall_time_s=0.5)  # the wall clock fires first


def _run(code: str, limits: SandboxLimitsConfig = FAST, stdin: str = ""):
    return run_python(textwrap.dedent(code), stdin=stdin, limits=limits)


# name -> (program, limits, expected status, substring of some violation line or None)
HOSTILE = {
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", FAST, "violation", "os.fork"),
    "subprocess_popen": ("import subprocess\nsubprocess.Popen(['ls'])", FAST, "violation", "subprocess"),
    "os_system": ("import os\nos.system('echo hi')", FAST, "violation", "os.system"),
    "os_execv": ("import os\nos.execv('/bin/sh', ['sh', '-c', 'id'])", FAST, "violation", "os.exec"),
    "posix_spawn": ("import os\nos.posix_spawn('/bin/sh', ['sh'], {})", FAST, "violation", "posix_spawn"),
    "pty_fork": ("import pty\npty.fork()", FAST, "violation", "forkpty"),
    "infinite_loop_wall": ("while True:\n    pass", WALL, "timeout", None),
    "sleep_wall": ("import time\ntime.sleep(60)", WALL, "timeout", None),
    "huge_bytearray": ("b = bytearray(10**10)", FAST, "memory", None),
    "list_growth": ("l = []\nwhile True:\n    l.append('x' * 100000)", FAST, "memory", None),
    "write_tmp": ("open('OUTSIDE_FILE', 'w').write('pwned')", FAST, "violation", "write"),
    "write_parent_dir": ("open('../escape', 'w').write('pwned')", FAST, "violation", "escape"),
    "huge_file": ("f = open('big', 'wb')\nf.write(b'x' * 3_000_000)\nf.close()", FAST, "output_limit", None),
    "many_files": (
        "i = 0\nwhile True:\n    open('f%d' % i, 'w').write('x' * 200_000)\n    i += 1",
        FAST,
        "output_limit",
        None,
    ),
    "connect_localhost": (
        "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', PORT))",
        FAST,
        "violation",
        "socket",
    ),
    "connect_8888": (
        "import socket\nsocket.create_connection(('8.8.8.8', 53), timeout=1)",
        FAST,
        "violation",
        "socket",
    ),
    "dns_lookup": ("import socket\nsocket.getaddrinfo('example.com', 80)", FAST, "violation", "socket"),
    "dunder_import_socket": ("s = __import__('so' + 'cket')", FAST, "violation", "socket"),
    "importlib_socket": ("import importlib\nimportlib.import_module('_socket')", FAST, "violation", "socket"),
    "find_spec_socket": (
        "import importlib.util as u\nspec = u.find_spec('_socket')\nu.module_from_spec(spec)",
        FAST,
        "violation",
        "socket",
    ),
    "read_passwd": ("print(open('/etc/passwd').read())", FAST, "violation", "/etc/passwd"),
    "read_proc_environ": ("print(open('/proc/self/environ', 'rb').read())", FAST, "violation", "environ"),
    "read_dev_stdin_link": ("print(open('/dev/stdin').read())", FAST, "violation", "/dev/stdin"),
    "chdir_root_then_read": (
        "import os\nos.chdir('/')\nprint(open('etc/passwd').read())",
        FAST,
        "violation",
        "os.chdir",
    ),
    "symlink_to_passwd": (
        "import os\nos.symlink('/etc/passwd', 'p')\nprint(open('p').read())",
        FAST,
        "violation",
        "os.symlink",
    ),
    "pathlike_passwd": (
        "import pathlib\nprint(open(pathlib.Path('/etc/passwd')).read())",
        FAST,
        "violation",
        "passwd",
    ),
    "listdir_root": ("import os\nprint(os.listdir('/'))", FAST, "violation", "os.listdir"),
    "remove_outside": ("import os\nos.remove('OUTSIDE_FILE')", FAST, "violation", "os.remove"),
    "rmtree_outside": ("import shutil\nshutil.rmtree('OUTSIDE_DIR')", FAST, "violation", "rmtree"),
    "kill_parent": ("import os\nos.kill(os.getppid(), 9)", FAST, "violation", "os.kill"),
    "killpg_everything": ("import os\nos.kill(-1, 9)", FAST, "violation", "os.kill"),
    "pidfd_kill_parent": (
        "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)",
        FAST,
        "violation",
        "pidfd",
    ),
    "ctypes_call": ("import ctypes\nctypes.CDLL(None).getpid()", FAST, "violation", "ctypes"),
    "ctypes_so_renamed": (
        "import _imp, os, sys\n"
        "d = [p for p in sys.path if p.endswith('lib-dynload')][0]\n"
        "so = [n for n in os.listdir(d) if n.startswith('_ctypes.')][0]\n"
        "spec = type('S', (), {'name': 'harmless', 'origin': os.path.join(d, so)})()\n"
        "_imp.create_dynamic(spec)",
        FAST,
        "violation",
        "_ctypes",
    ),
    "catch_and_continue": (
        "try:\n    open('/etc/passwd').read()\nexcept BaseException:\n    pass\nprint('after')",
        FAST,
        "violation",
        "/etc/passwd",
    ),
    "recursion_bomb": ("def f(n):\n    return f(n + 1)\nf(0)", FAST, "error", None),
    "threading_bomb": (
        "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(10,)).start()",
        FAST,
        "violation",
        "thread",
    ),
    "os_open_read": (
        "import os\nfd = os.open('/etc/hostname', os.O_RDONLY)\nprint(os.read(fd, 100))",
        FAST,
        "violation",
        "/etc/hostname",
    ),
    "os_open_write": (
        "import os\nos.open('OUTSIDE_FILE', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)",
        FAST,
        "violation",
        "write",
    ),
    "os_open_directory": ("import os\nos.open('.', os.O_RDONLY | os.O_DIRECTORY)", FAST, "violation", "open"),
    "signal_ignore_xcpu": (
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
        FAST,
        "violation",
        "signal.signal",
    ),
    "signal_block_xcpu": (
        "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGXCPU})\nwhile True:\n    pass",
        SandboxLimitsConfig(cpu_time_s=1, wall_time_s=1.2),
        "timeout",
        None,
    ),
    "sigstop_self": ("import signal\nsignal.raise_signal(signal.SIGSTOP)", WALL, "timeout", None),
    "raise_rlimit": (
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))",
        FAST,
        "violation",
        "setrlimit",
    ),
    "add_audit_hook": ("import sys\nsys.addaudithook(lambda *a: None)", FAST, "violation", "addaudithook"),
    "settrace": ("import sys\nsys.settrace(lambda *a: None)", FAST, "violation", "settrace"),
    "mknod_outside": ("import os\nos.mknod('OUTSIDE_FILE')", FAST, "violation", "mknod"),
    "fresh_posix_copy": (
        "import _imp, sys\n_imp.create_builtin(sys.modules['posix'].__spec__)",
        FAST,
        "violation",
        "create_builtin",
    ),
    "reimport_posix": ("import sys\ndel sys.modules['posix']\nimport posix", FAST, "violation", "posix"),
    "marshal_code": (
        "import marshal\nmarshal.loads(marshal.dumps(compile('1', 's', 'eval')))",
        FAST,
        "violation",
        "marshal",
    ),
    "craft_code_object": ("(lambda: 0).__code__.replace(co_consts=(1,))", FAST, "violation", "code.__new__"),
    "gc_objects": ("import gc\ngc.get_objects()", FAST, "violation", "gc.get_objects"),
    "pwd_database": ("import pwd\nprint(pwd.getpwall())", FAST, "violation", "pwd"),
    "tamper_report_pipe": (
        "import os\nfor fd in range(3, 64):\n    try:\n        os.close(fd)\n    except OSError:\n        pass\n"
        "try:\n    open('/etc/passwd')\nexcept BaseException:\n    pass\nprint('survived')",
        FAST,
        "violation",
        None,
    ),
    "patched_builtins": (
        "import builtins, os\nbuiltins.isinstance = lambda *a: False\nos.getcwd = lambda: '/etc'\n"
        "print(open('/etc/passwd').read())",
        FAST,
        "violation",
        "/etc/passwd",
    ),
    "str_subclass_path": (
        "class S(str):\n    def startswith(self, *a):\n        return True\nprint(open(S('/etc/passwd')).read())",
        FAST,
        "violation",
        "/etc/passwd",
    ),
}
SLOW = {"infinite_loop_wall", "sleep_wall", "signal_block_xcpu", "sigstop_self", "list_growth"}


@pytest.fixture
def outside(tmp_path):
    """A file and a folder outside any sandbox work dir, and a listening socket."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "inner.txt").write_text("keep me too")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.05)
    yield {"file": victim, "dir": folder, "new": tmp_path / "created.txt", "listener": listener}
    listener.close()


def _program(name: str, outside: dict) -> str:
    target = outside["new"] if name in ("write_tmp", "os_open_write", "mknod_outside") else outside["file"]
    code = HOSTILE[name][0].replace("OUTSIDE_FILE", str(target)).replace("OUTSIDE_DIR", str(outside["dir"]))
    return code.replace("PORT", str(outside["listener"].getsockname()[1]))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_is_contained(name, outside):
    _, limits, status, fragment = HOSTILE[name]
    start = time.monotonic()
    result = _run(_program(name, outside), limits)
    assert result.status == status, (
        result.status,
        result.returncode,
        result.violations,
        result.stderr[-300:],
    )
    if status == "violation":
        assert result.violations
        if fragment is not None:
            assert any(fragment in v for v in result.violations), result.violations
        assert "after" not in result.stdout and "survived" not in result.stdout  # it ended at once
    # the world outside the work dir is untouched
    assert outside["file"].read_text() == "keep me"
    assert (outside["dir"] / "inner.txt").read_text() == "keep me too"
    assert not outside["new"].exists()
    with pytest.raises(OSError):  # nothing reached the listening socket
        outside["listener"].accept()
    # the parent never waits much past the wall-clock limit
    assert time.monotonic() - start < limits.wall_time_s + 2.5
    assert result.wall_s <= limits.wall_time_s + 2.5


def test_timeouts_report_the_right_signal():
    wall = _run("while True:\n    pass", WALL)
    assert wall.status == "timeout" and wall.returncode == -signal.SIGKILL  # killed by the parent
    assert 0.4 < wall.wall_s < 2.0
    cpu = _run("while True:\n    pass", SandboxLimitsConfig(cpu_time_s=1, wall_time_s=10))
    assert cpu.status == "timeout" and cpu.returncode == -signal.SIGXCPU  # RLIMIT_CPU


def test_secret_environment_is_not_inherited(monkeypatch):
    monkeypatch.setenv("AZR_FAKE_SECRET", "hunter2-token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "also-secret")
    result = _run("import os\nprint(sorted(os.environ.items()))\nprint(os.getenv('HOME'))")
    assert result.status == "ok", result.stderr
    assert "hunter2" not in result.stdout and "also-secret" not in result.stdout
    assert "AZR_FAKE_SECRET" not in result.stdout and "HOME" not in result.stdout
    assert result.stdout.splitlines()[-1] == "None"


def test_huge_output_is_cut_and_flagged():
    limits = SandboxLimitsConfig(cpu_time_s=2, wall_time_s=5, max_output_bytes=1000)
    result = _run("import sys\nsys.stdout.write('y' * 10_000_000)", limits)
    assert result.status == "output_limit"
    assert result.stdout == "y" * 1000


def test_normal_program_output_and_stdin():
    result = _run("import sys\ndata = sys.stdin.read()\nprint(data.upper(), sum(range(10)))", stdin="abc")
    assert result.ok and result.returncode == 0 and result.violations == []
    assert result.stdout == "ABC 45\n"


def test_undecodable_text_does_not_break_the_parent():
    result = run_python("print('a\udc80b')", stdin="\udc80", limits=FAST)  # lone surrogates
    assert result.ok and result.stdout == "a?b\n"


def test_error_exit_and_exception():
    assert _run("import sys\nsys.exit(3)").status == "error"
    result = _run("raise ValueError('boom')")
    assert result.status == "error" and result.returncode == 1
    assert "ValueError: boom" in result.stderr


def test_files_inside_the_work_dir_and_cleanup():
    code = """
        import os, pathlib
        open('a.txt', 'w').write('hello')
        os.mkdir('sub')
        pathlib.Path('sub/b.txt').write_text('world')
        os.rename('sub/b.txt', 'c.txt')
        print(open('a.txt').read(), open('c.txt').read(), sorted(os.listdir('.')))
        print(os.getcwd())
    """
    result = _run(code)
    assert result.ok, (result.violations, result.stderr)
    first, cwd = result.stdout.splitlines()
    assert first == "hello world ['a.txt', 'c.txt', 'main.py', 'sub']"
    assert os.path.isabs(cwd) and not os.path.exists(cwd)  # the work dir is gone afterwards
    assert not os.path.exists(os.path.dirname(cwd))


def test_stdlib_imports_work():
    code = "import collections, itertools, functools, math, re, json, heapq, random, fractions\nprint('ok')"
    result = _run(code, SandboxLimitsConfig(cpu_time_s=2, wall_time_s=10))
    assert result.ok, (result.violations, result.stderr)
    assert result.stdout == "ok\n"


def test_fork_allowed_only_within_max_processes():
    limits = SandboxLimitsConfig(cpu_time_s=2, wall_time_s=5, max_processes=2)
    code = """
        import os
        for i in range(4):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            print('forked', i, flush=True)
    """
    result = _run(code, limits)
    assert result.status == "violation" and "process limit" in result.violations[0]
    assert result.stdout == "forked 0\nforked 1\n"  # two tokens, the third fork is refused


def test_forked_child_keeps_the_hook():
    limits = SandboxLimitsConfig(cpu_time_s=2, wall_time_s=5, max_processes=1)
    code = "import os\npid = os.fork()\nif pid == 0:\n    open('/etc/passwd')\nelse:\n    os.waitpid(pid, 0)"
    result = _run(code, limits)
    assert result.status == "violation" and "/etc/passwd" in result.violations[0]


def test_hook_has_no_mutable_or_global_dependencies():
    """The design rule of the audit hook: no closure, no global/builtin lookups, no imports."""
    code = next(c for c in _runner._make_hook.__code__.co_consts if getattr(c, "co_name", "") == "hook")
    assert code.co_freevars == () and code.co_cellvars == ()
    ops = {ins.opname for ins in dis.get_instructions(code)}
    assert not ops & {
        "LOAD_GLOBAL",
        "LOAD_NAME",
        "LOAD_DEREF",
        "LOAD_CLASSDEREF",
        "IMPORT_NAME",
        "STORE_GLOBAL",
    }


def test_trainer_keeps_running_after_all_hostile_programs(tmp_path):
    """Everything hostile back to back in this one process: no leaked folders, descriptors or
    children, and a normal program still works."""
    base = tempfile.gettempdir()
    before_dirs = {n for n in os.listdir(base) if n.startswith("azr-sbx-")}
    before_fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "inner.txt").write_text("keep me too")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    outside = {
        "file": victim,
        "dir": tmp_path / "folder",
        "new": tmp_path / "created.txt",
        "listener": listener,
    }
    try:
        for name in sorted(set(HOSTILE) - SLOW):
            result = _run(_program(name, outside), HOSTILE[name][1])
            assert result.status == HOSTILE[name][2], name
    finally:
        listener.close()
    result = _run("print(sum(x * x for x in range(4)))")
    assert result.ok and result.stdout == "14\n"
    assert victim.read_text() == "keep me"
    assert {n for n in os.listdir(base) if n.startswith("azr-sbx-")} == before_dirs
    if before_fds is not None:
        assert len(os.listdir("/proc/self/fd")) == before_fds


def test_stdlib_root_is_readable_but_not_writable():
    stdlib = sysconfig.get_paths()["stdlib"]
    ok = _run(f"print(len(open({os.path.join(stdlib, 'os.py')!r}).read()) > 0)")
    assert ok.ok and ok.stdout == "True\n", (ok.violations, ok.stderr)
    bad = _run(f"open({os.path.join(stdlib, 'azr_evil.py')!r}, 'w')")
    assert bad.status == "violation"
    assert not os.path.exists(os.path.join(stdlib, "azr_evil.py"))
