"""Child-side bootstrap of the ``python_exec`` sandbox (see :mod:`.sandbox` for the whole design).

The parent runs this file's text as ``python -I -S -B -X utf8 -c <text> VFD TFD CPU MEM FSIZE NPROC``
with the work directory as cwd and the user program in ``main.py`` there. It must stay standard
library only and cheap to start. Importing it (tests) only defines functions.

Boot order: rlimits -> read and compile ``main.py`` -> pre-import the built-in C modules -> replace
the unaudited dangerous functions with guards -> install the audit hook -> run the program.

The hook is written so that nothing it relies on can be changed from the program, even if the
program gets hold of its frame (a finalizer or ``gc`` callback that runs while the hook allocates
can call ``sys._getframe``): it has no closure, looks up no global or builtin name, calls no
Python-level function, and everything it uses arrives as a default argument bound at definition
time to an immutable value (builtin functions, str, int, tuple, frozenset). It only calls methods
of exact str/bytes/tuple values. On the first forbidden operation it writes one line to the
violation pipe and ends the process with ``EXIT_VIOLATION`` (``os._exit``): the program never gets
the chance to catch anything and carry on.
"""

import sys

EXIT_VIOLATION = 111  # the hook ended the run (the parent also reads the violation pipe)
EXIT_MEMORY = 112  # the program raised MemoryError (RLIMIT_AS)
EXIT_FSIZE = 113  # a write hit RLIMIT_FSIZE (EFBIG)
NOFILE = 32  # open files at once; the interpreter itself needs a few

# Imports of these (or of their sub-modules) are violations: raw memory (ctypes, test modules),
# networking, process spawning helpers, sub-interpreters (a new interpreter has no Python-level audit
# hook), and C modules that open files or sockets without an audit event (dbm, sqlite, pwd, ...).
DENY_MODULES = frozenset(
    {
        "_ctypes", "ctypes", "_ctypes_test", "_socket", "socket", "_ssl", "ssl", "_posixsubprocess",
        "_posixshmem", "_multiprocessing", "_dbm", "_gdbm", "_sqlite3", "sqlite3", "pwd", "grp",
        "spwd", "nis", "readline", "_curses", "_curses_panel", "_tkinter", "ossaudiodev", "syslog",
        "_xxsubinterpreters", "_xxinterpchannels", "_xxinterpqueues", "_interpreters",
        "_interpchannels", "_interpqueues", "_testcapi", "_testinternalcapi", "_testbuffer",
        "_testmultiphase", "_testimportmultiple", "_testsinglephase", "_testclinic",
        "_testclinic_limited", "_testlimitedcapi", "_testexternalinspection", "_xxtestfuzz",
        "_remote_debugging",
    }
)  # fmt: skip
# Already loaded at boot and patched with guards: importing them again would bring back originals.
PROTECTED_MODULES = frozenset({"posix", "_signal", "_thread", "_imp"})
# Always violations. Process images other than this interpreter (exec, system, spawn, Popen) would
# run without the hook, so they stay forbidden even when ``max_processes`` > 0.
DENY_EVENTS = frozenset(
    {
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile", "subprocess.Popen",
        "os.kill", "os.killpg", "signal.pthread_kill", "os.link", "os.symlink", "os.setns",
        "os.unshare", "os.add_dll_directory", "resource.setrlimit", "resource.prlimit",
        "sys.addaudithook", "sys.settrace", "sys.setprofile", "sys._current_frames",
        "sys._current_exceptions", "sys.monitoring.register_callback", "gc.get_objects",
        "gc.get_referrers", "gc.get_referents", "code.__new__", "marshal.loads", "marshal.load",
        "cpython.PyInterpreterState_New", "fcntl.ioctl", "urllib.Request", "webbrowser.open",
        "sys.remote_exec", "remote_debugger_script", "sandbox.blocked",
    }
)  # fmt: skip
DENY_PREFIXES = (
    "socket.", "ctypes.", "http.client.", "ftplib.", "smtplib.", "imaplib.", "poplib.", "nntplib.",
    "telnetlib.", "sqlite3.", "syslog.", "winreg.", "msvcrt.", "_winapi.",
)  # fmt: skip
FORK_EVENTS = frozenset({"os.fork", "os.forkpty", "_thread.start_new_thread"})
# Events whose first argument is a path the program reads (must be inside the work dir or a read
# root) or changes (must be inside the work dir). Two-path events check both arguments.
READ_PATH_EVENTS = frozenset(
    {"os.listdir", "os.scandir", "os.walk", "os.fwalk", "os.getxattr", "os.listxattr"}
)
WRITE_PATH_EVENTS = frozenset(
    {
        "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.chflags", "os.lchflags",
        "os.lchmod", "os.utime", "os.truncate", "os.setxattr", "os.removexattr", "shutil.rmtree",
        "shutil.chown", "tempfile.mkstemp", "tempfile.mkdtemp", "os.chdir", "os.mkfifo", "os.mknod",
    }
)  # fmt: skip
WRITE2_EVENTS = frozenset({"os.rename", "shutil.move"})  # both paths change
COPY_EVENTS = frozenset({"shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree",
                         "shutil.unpack_archive"})  # fmt: skip
GUARDED_OS = ("mknod", "mkfifo", "chroot", "setns", "unshare")  # no audit event (3.11) -> guards
BLOCKED_ATTRS = frozenset({"__code__"})  # (namedtuple sets __defaults__, so that one stays allowed)


def _set_limits(cpu: int, mem: int, fsize: int, nproc: int) -> None:
    """Lower the rlimits of this process (inherited by anything it could start)."""
    import resource

    inf = resource.RLIM_INFINITY

    def cap(res: int, soft: int, hard: int) -> None:
        _, cur_hard = resource.getrlimit(res)
        if cur_hard != inf:  # an unprivileged process cannot raise its hard limit
            hard, soft = min(hard, cur_hard), min(soft, cur_hard)
        resource.setrlimit(res, (soft, hard))

    cap(resource.RLIMIT_CPU, cpu, cpu + 1)  # SIGXCPU at the soft limit, SIGKILL at the hard one
    cap(resource.RLIMIT_AS, mem, mem)
    cap(resource.RLIMIT_FSIZE, fsize, fsize)
    cap(resource.RLIMIT_NOFILE, NOFILE, NOFILE)
    cap(resource.RLIMIT_CORE, 0, 0)
    if nproc == 0 and hasattr(resource, "RLIMIT_NPROC"):
        cap(resource.RLIMIT_NPROC, 0, 0)  # no fork/thread at all (ignored for root: the hook covers it)


def _install_guards(allow_fork: bool) -> None:
    """Replace dangerous functions that raise no audit event with C-level guards that do.

    A guard is ``functools.partial(sys.audit, "sandbox.blocked", NAME)``: a C object with no Python
    frame or closure, so the program cannot unwrap it; calling it raises an event the hook refuses.
    """
    import _functools
    import _imp
    import _signal
    import _thread
    import os
    import posix

    def guard(name: str) -> object:
        return _functools.partial(sys.audit, "sandbox.blocked", name)

    for mod in (posix, os):
        for name in GUARDED_OS:
            if hasattr(mod, name):
                setattr(mod, name, guard("os." + name))
    # pidfd_send_signal could kill the parent; Python signal handlers run between any two bytecodes,
    # also inside the hook, so installing one is refused too
    for name in ("signal", "pidfd_send_signal"):
        if hasattr(_signal, name):
            setattr(_signal, name, guard("signal." + name))
    # create_builtin makes a fresh copy of a built-in module, with the unguarded originals
    _imp.create_builtin = guard("_imp.create_builtin")
    if not allow_fork:  # starting a thread raises no audit event before 3.13
        for name in ("start_new_thread", "start_new", "start_joinable_thread"):
            if hasattr(_thread, name):
                setattr(_thread, name, guard("_thread." + name))


def _make_hook(work: str, roots: tuple, vfd: int, tfd: int, allow_fork: bool):
    """The audit hook (see the module docstring for why it is written this way)."""
    import os

    vst, tst = os.fstat(vfd), os.fstat(tfd)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    rw_files = frozenset({"/dev/null"})
    ro_files = frozenset({"/dev/null", "/dev/urandom", "/dev/random"})
    roots_prefixes = tuple(r + "/" for r in roots)
    o_directory = getattr(os, "O_DIRECTORY", 0)
    # (st_dev, st_ino) of the two pipes, read by index: os.stat_result is a mutable type
    vkey, tkey = (vst[2], vst[1]), (tst[2], tst[1])

    def hook(
        event, args,
        _str=str, _bytes=bytes, _int=int, _type=type, _isinstance=isinstance, _len=len,
        _sstr=str.__str__, _bdecode=bytes.decode, _repr=repr, _item=tuple.__getitem__,
        _OSError=OSError, _Base=BaseException, _lstat=os.lstat, _stat=os.stat, _fstat=os.fstat, _readlink=os.readlink,
        _getcwd=os.getcwd, _write=os.write, _read=os.read, _exit=os._exit,
        _work=work, _workp=work + "/", _roots=roots, _rootsp=roots_prefixes,
        _rw=rw_files, _ro=ro_files, _vfd=vfd, _vkey=vkey, _tfd=tfd,
        _tkey=tkey, _fork=allow_fork, _wflags=write_flags,
        _odir=o_directory, _deny_ev=DENY_EVENTS, _deny_pre=DENY_PREFIXES,
        _fork_ev=FORK_EVENTS, _read_ev=READ_PATH_EVENTS, _write_ev=WRITE_PATH_EVENTS,
        _write2_ev=WRITE2_EVENTS, _copy_ev=COPY_EVENTS, _deny_mod=DENY_MODULES,
        _prot_mod=PROTECTED_MODULES, _attrs=BLOCKED_ATTRS, _viol=EXIT_VIOLATION,
    ):  # fmt: skip
        bad = None
        checks = ()  # (path object, mode): mode 0 read, 1 write, 2 open (flags decide), 3 extension
        if event == "open":
            if _len(args) > 2 and _type(args[2]) is _int and args[2] & _odir:
                bad = "open(O_DIRECTORY)"
            else:
                checks = ((args[0], 2),)
        elif event == "import":
            name = args[0]
            if not _isinstance(name, _str):
                bad = "import of a non-str name"
            else:
                name = _sstr(name)
                if name in _prot_mod or name.partition(".")[0] in _deny_mod or name in _deny_mod:
                    bad = "import " + name
                elif _len(args) > 1 and args[1] is not None:
                    checks = ((args[1], 3),)  # an extension module's file: only from the stdlib
        elif event in _read_ev:
            checks = ((args[0], 0),)
        elif event in _write_ev:
            checks = ((args[0], 1),)
        elif event in _write2_ev:
            checks = ((args[0], 1), (args[1], 1))
        elif event in _copy_ev:
            checks = ((args[0], 0), (args[1], 1))
        elif event == "shutil.make_archive":
            checks = ((args[0], 1),) if args[2] is None else ((args[0], 1), (args[2], 0))
        elif event in _fork_ev:
            if not _fork:
                bad = event
            else:  # one token from the parent's pipe per process; the pipe is shared by all forks
                try:
                    s = _fstat(_tfd)
                    if (_item(s, 2), _item(s, 1)) != _tkey or not _read(_tfd, 1):
                        bad = event + " (process limit)"
                except _OSError:
                    bad = event + " (process limit)"
        elif event in _deny_ev or event.startswith(_deny_pre):
            bad = event
            if event == "sandbox.blocked" and _len(args) > 0 and _type(args[0]) is _str:
                bad = args[0]
        elif (
            (event == "object.__setattr__" or event == "object.__delattr__")
            and _len(args) > 1
            and _type(args[1]) is _str
            and args[1] in _attrs
        ):
            bad = event + " " + args[1]

        for obj, mode in checks:
            if bad is not None:
                break
            if _type(obj) is _int and mode != 3 and event != "os.chdir":
                continue  # an already open file descriptor
            if obj is None and mode == 0:
                obj = "."
            if _isinstance(obj, _str):
                path = _sstr(obj)
            elif _isinstance(obj, _bytes):
                path = _bdecode(obj, "utf-8", "surrogateescape")
            else:  # a path-like object could answer differently to the hook than to the C code
                bad = event + " with a non-str path"
                break
            # resolve like the kernel: absolute, '..' and symlinks (no symlink can be created here)
            full = path if path.startswith("/") else _getcwd() + "/" + path
            parts = full.split("/")
            parts.reverse()
            out, exists, hops = "", True, 0
            while parts:
                c = parts.pop()
                if c == "" or c == ".":
                    continue
                if c == "..":
                    out = out[: out.rfind("/")] if out else ""
                    continue
                nxt = out + "/" + c
                if exists:
                    try:
                        m = _item(_lstat(nxt), 0)
                    except _OSError:
                        exists, m = False, 0
                    if m & 0o170000 == 0o120000:
                        hops += 1
                        try:
                            target = _readlink(nxt)
                        except _OSError:
                            target = None
                        if hops > 40 or target is None:
                            bad = event + " " + _repr(path) + " (symlink loop)"
                            break
                        more = target.split("/")
                        more.reverse()
                        parts.extend(more)
                        if target.startswith("/"):
                            out = ""
                        continue
                out = nxt
            if bad is not None:
                break
            full = out or "/"
            inside = full == _work or full.startswith(_workp)
            in_roots = full in _roots or full.startswith(_rootsp)
            if mode == 2:  # open: the flags say whether it writes
                flags = args[2] if _len(args) > 2 and _type(args[2]) is _int else 0
                writes = flags & _wflags
                if writes and not inside and full not in _rw:
                    bad = "open(" + _repr(path) + ", write)"
                elif not writes and not inside and not in_roots and full not in _ro:
                    bad = "open(" + _repr(path) + ", read)"
                else:
                    try:
                        m = _item(_stat(full), 0) & 0o170000
                    except _OSError:
                        m = 0o100000  # not there (yet): a new regular file
                    if m == 0o040000:
                        bad = "open(" + _repr(path) + ") of a directory"
                    elif m != 0o100000 and full not in _ro and full not in _rw:
                        bad = "open(" + _repr(path) + ") of a special file"
            elif mode == 3:
                base = full[full.rfind("/") + 1 :].partition(".")[0]
                if not in_roots or base in _deny_mod:
                    bad = event + " " + _repr(path)
            elif not inside and (mode == 1 or not in_roots):
                bad = event + "(" + _repr(path) + ")"

        if bad is None:
            return
        # record first (the parent reads the pipe), then end the process: nothing can be caught
        try:
            s = _fstat(_vfd)
            if (_item(s, 2), _item(s, 1)) == _vkey:
                _write(_vfd, (bad[:300] + "\n").encode("utf-8", "backslashreplace"))
        except _Base:  # even a KeyboardInterrupt must not stop the exit
            pass
        _exit(_viol)

    return hook


def _main() -> None:
    vfd, tfd, cpu, mem, fsize, nproc = (int(a) for a in sys.argv[1:7])
    _set_limits(cpu, mem, fsize, nproc)
    import os

    work = os.path.realpath(os.getcwd())
    with open("main.py", encoding="utf-8") as fh:
        code = compile(fh.read(), "main.py", "exec")
    # load every built-in C module now, so that importing one later needs no create_builtin call
    for name in sys.builtin_module_names:
        if name not in sys.modules and name not in DENY_MODULES:
            __import__(name)
    roots = tuple(sorted({os.path.realpath(p) for p in sys.path if p}))
    _install_guards(allow_fork=nproc > 0)
    # .pyc files are unmarshalled code (marshal.loads is refused): compile imported modules from
    # source instead, by pointing the byte-code cache at a folder that does not exist
    sys.pycache_prefix = work + "/.no-pycache"
    sys.dont_write_bytecode = True
    sys.addaudithook(_make_hook(work, roots, vfd, tfd, allow_fork=nproc > 0))
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
    except MemoryError:
        namespace.clear()  # free what the program held, so the message can be printed
        sys.stderr.write("MemoryError: the program ran out of memory\n")
        raise SystemExit(EXIT_MEMORY) from None
    except OSError as exc:
        if exc.errno != 27:  # EFBIG: a write past RLIMIT_FSIZE
            raise
        sys.stderr.write(f"OSError: {exc}\n")
        raise SystemExit(EXIT_FSIZE) from None


if __name__ == "__main__":
    _main()
