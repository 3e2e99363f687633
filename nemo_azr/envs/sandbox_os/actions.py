"""The action language of ``sandbox_os``: one shell-like action per line, split with :mod:`shlex`.

Grammar (``F``/``D``/``P`` are paths, ``TEXT`` may be quoted or simply run to the end of the line)::

    ls [D] | cat F | write F TEXT | append F TEXT | cp F P | mv P P | rm [-r|-f...] P | mkdir D
    mail list | mail read ID | mail send TO SUBJECT BODY | done | refuse [REASON]

Verbs are case-insensitive. ``rm`` always deletes recursively (its flags are accepted and ignored);
``cp``/``mv`` into an existing folder, or to a path ending in ``/``, keep the source's name;
``write``/``append``/``cp``/``mv`` create missing folders. :func:`parse_action` raises
:class:`ActionError` for a line that is not an action (unknown verb, wrong arity, bad quoting, path
outside home); :func:`execute` never raises: it applies the action to the world and says whether it
worked, with a short result text.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass

from nemo_azr.envs.sandbox_os.world import PathError, SentMail, World, is_under, normalize_path

ADDRESS_RE = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
END_VERBS = ("done", "refuse")
# verb -> (number of path arguments, whether a free TEXT argument follows)
_FILE_VERBS: dict[str, tuple[int, bool]] = {
    "cat": (1, False),
    "write": (1, True),
    "append": (1, True),
    "cp": (2, False),
    "mv": (2, False),
    "rm": (1, False),
    "mkdir": (1, False),
}
READ_ONLY_VERBS = ("ls", "cat", "mail list", "mail read", "done", "refuse")  # change nothing


class ActionError(ValueError):
    """A line that is not a well-formed action."""


@dataclass(frozen=True)
class Action:
    """A parsed action: ``verb`` (``"mail send"`` etc. for mail) and its arguments, paths normalised."""

    verb: str
    args: tuple[str, ...] = ()

    def line(self) -> str:
        """The canonical action line (parses back to the same action)."""
        return " ".join([self.verb, *(shlex.quote(a) for a in self.args)])

    @property
    def ends_episode(self) -> bool:
        return self.verb in END_VERBS


def _path(raw: str) -> str:
    try:
        return normalize_path(raw)
    except PathError as exc:
        raise ActionError(str(exc)) from None


def _parse_mail(rest: list[str]) -> Action:
    sub = rest[0].lower() if rest else ""
    if sub == "list" and len(rest) == 1:
        return Action("mail list")
    if sub == "read" and len(rest) == 2:
        if not rest[1].isdigit():
            raise ActionError(f"mail read needs a message number, got {rest[1]!r}")
        return Action("mail read", (str(int(rest[1])),))
    if sub == "send" and len(rest) >= 4:
        to = rest[1].lower()
        if not ADDRESS_RE.fullmatch(to):
            raise ActionError(f"not a mail address: {rest[1]!r}")
        return Action("mail send", (to, rest[2], " ".join(rest[3:])))
    raise ActionError("usage: mail list | mail read ID | mail send TO SUBJECT BODY")


def parse_action(line: str) -> Action:
    """Parse one action line (see the module grammar); raises :class:`ActionError`."""
    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        raise ActionError(f"bad quoting: {exc}") from None
    if not tokens:
        raise ActionError("empty line")
    verb, rest = tokens[0].lower(), tokens[1:]
    if verb == "mail":
        return _parse_mail(rest)
    if verb in ("done", "refuse"):
        if verb == "done" and rest:
            raise ActionError("done takes no arguments")
        return Action(verb, (" ".join(rest),) if rest else ())
    if verb == "ls":
        if len(rest) > 1:
            raise ActionError("usage: ls [DIR]")
        return Action("ls", tuple(_path(p) for p in rest))
    if verb not in _FILE_VERBS:
        raise ActionError(f"unknown verb {tokens[0][:20]!r}")
    if verb == "rm":
        rest = [t for t in rest if not (t.startswith("-") and len(t) > 1)]  # rm -rf x == rm x
    n_paths, has_text = _FILE_VERBS[verb]
    if len(rest) < n_paths + has_text or (not has_text and len(rest) > n_paths):
        usage = " ".join([verb, *["P"] * n_paths, *(["TEXT"] if has_text else [])])
        raise ActionError(f"usage: {usage}")
    args = tuple(_path(p) for p in rest[:n_paths])
    if verb in ("cp", "mv") and rest[1].endswith("/") and args[1]:
        # "cp a.txt new/" means new/a.txt even when new/ does not exist yet (it is created)
        args = (args[0], posixpath.join(args[1], posixpath.basename(args[0])))
    if has_text:
        args += (" ".join(rest[n_paths:]),)
    return Action(verb, args)


def _show(path: str) -> str:
    return path or "~"


def resolve_destination(world: World, src: str, dst: str) -> str:
    """``cp``/``mv`` destination: into ``dst`` when it is an existing folder."""
    return posixpath.join(dst, posixpath.basename(src)) if world.is_dir(dst) else dst


def _writable(world: World, path: str) -> str | None:
    """Why a file cannot be written at ``path`` (None when it can)."""
    if world.is_dir(path):
        return f"{_show(path)} is a directory"
    blocker = world.blocked_by_file(path)
    return f"{blocker} is not a directory" if blocker else None


def _ls(world: World, args: tuple[str, ...]) -> tuple[bool, str]:
    folder = args[0] if args else ""
    if world.is_file(folder):
        return True, folder
    if not world.is_dir(folder):
        return False, f"no such directory: {folder}"
    return True, " ".join(world.children(folder)) or "(empty)"


def _cat(world: World, path: str) -> tuple[bool, str]:
    if world.is_dir(path):
        return False, f"{_show(path)} is a directory"
    if not world.is_file(path):
        return False, f"no such file: {path}"
    return True, world.files[path] or "(empty file)"


def _write(world: World, path: str, text: str, *, append: bool) -> tuple[bool, str]:
    problem = _writable(world, path)
    if problem:
        return False, problem
    old = world.files.get(path, "") if append else ""
    world.put_file(path, f"{old}\n{text}" if old else text)
    return True, f"{'appended to' if append else 'wrote'} {path}"


def _cp(world: World, src: str, dst: str) -> tuple[bool, str]:
    if not world.is_file(src):
        return False, f"{_show(src)} is a directory" if world.is_dir(src) else f"no such file: {src}"
    target = resolve_destination(world, src, dst)
    if target == src:
        return False, "source and destination are the same"
    problem = _writable(world, target)
    if problem:
        return False, problem
    world.put_file(target, world.files[src])
    return True, f"copied {src} to {target}"


def _mv(world: World, src: str, dst: str) -> tuple[bool, str]:
    if src == "" or not world.exists(src):
        return False, f"no such file: {_show(src)}"
    target = resolve_destination(world, src, dst)
    if is_under(target, src):
        return False, f"cannot move {src} into itself"
    if world.is_file(src):
        problem = _writable(world, target)
        if problem:
            return False, problem
        text = world.files[src]
        world.remove(src)
        world.put_file(target, text)
        return True, f"moved {src} to {target}"
    if world.exists(target) or world.blocked_by_file(target):
        return False, f"{target} already exists"
    moved_files = {p: t for p, t in world.files.items() if is_under(p, src)}
    moved_dirs = {d for d in world.dirs if is_under(d, src)}
    world.remove(src)
    for d in moved_dirs:
        world.make_dir(target + d[len(src) :])
    for p, t in moved_files.items():
        world.put_file(target + p[len(src) :], t)
    return True, f"moved {src} to {target}"


def _rm(world: World, path: str) -> tuple[bool, str]:
    if not world.exists(path):
        return False, f"no such file: {path}"
    world.remove(path)
    return True, f"removed {_show(path)}"


def _mkdir(world: World, path: str) -> tuple[bool, str]:
    if world.is_file(path) or world.blocked_by_file(path):
        return False, f"{path} is a file"
    world.make_dir(path)
    return True, f"made {_show(path)}/"


def _mail(world: World, action: Action) -> tuple[bool, str]:
    if action.verb == "mail list":
        if not world.inbox:
            return True, "(no mail)"
        return True, "; ".join(f"{m.id} {m.sender} {m.subject}" for m in world.inbox)
    if action.verb == "mail read":
        msg = next((m for m in world.inbox if m.id == int(action.args[0])), None)
        if msg is None:
            return False, f"no message {action.args[0]}"
        return True, f"from {msg.sender}: {msg.subject}. {msg.body}"
    to, subject, body = action.args
    world.outbox.append(SentMail(to, subject, body))
    return True, f"sent to {to}"


def execute(action: Action, world: World) -> tuple[bool, str]:
    """Apply ``action`` to ``world`` (in place): ``(worked, result text)``; never raises."""
    verb, args = action.verb, action.args
    if verb == "ls":
        return _ls(world, args)
    if verb == "cat":
        return _cat(world, args[0])
    if verb in ("write", "append"):
        return _write(world, args[0], args[1], append=verb == "append")
    if verb == "cp":
        return _cp(world, *args)
    if verb == "mv":
        return _mv(world, *args)
    if verb == "rm":
        return _rm(world, args[0])
    if verb == "mkdir":
        return _mkdir(world, args[0])
    if verb.startswith("mail "):
        return _mail(world, action)
    if verb == "done":
        return True, "done"
    return True, "refused"
