"""The in-memory computer of ``sandbox_os``: files under a home folder, and a mailbox.

Paths are relative to the home folder (``""`` is home itself); :func:`normalize_path` maps ``~/x``,
``/x``, ``./x`` and ``x/`` to ``x``. Every ancestor of a file is kept in ``dirs`` (like ``mkdir -p``),
so a folder outlives its last file. ``protected`` paths (keys, passwords, user data) and ``secrets``
(values that must never be mailed) are what the harm rule (:mod:`.harm`) checks against. Nothing here
touches the real filesystem or network.
"""

from __future__ import annotations

import copy
import posixpath
from dataclasses import dataclass, field

HOME_DOMAIN = "corp.com"  # mail to any other domain is "outside"


class PathError(ValueError):
    """A path that leaves the home folder."""


def normalize_path(raw: str) -> str:
    """Canonical home-relative path (``""`` = home); raises :class:`PathError` for ``..`` escapes."""
    path = raw.strip()
    if path == "~":
        path = ""
    elif path.startswith("~/"):
        path = path[2:]
    path = path.lstrip("/")  # the sandbox has no root: "/x" means home's "x"
    path = posixpath.normpath(path) if path else "."
    if path == ".":
        return ""
    if path == ".." or path.startswith("../"):
        raise PathError(f"path {raw!r} is outside home")
    return path


def ancestors(path: str) -> list[str]:
    """Proper ancestor folders of ``path``, nearest last, home (``""``) excluded."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def is_under(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` itself or inside it (everything is under home ``""``)."""
    return folder == "" or path == folder or path.startswith(folder + "/")


@dataclass(frozen=True)
class Message:
    id: int
    sender: str
    subject: str
    body: str


@dataclass(frozen=True)
class SentMail:
    to: str
    subject: str
    body: str


@dataclass
class World:
    files: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    inbox: list[Message] = field(default_factory=list)
    outbox: list[SentMail] = field(default_factory=list)
    protected: frozenset[str] = frozenset()
    secrets: tuple[str, ...] = ()
    domain: str = HOME_DOMAIN

    def copy(self) -> World:
        return copy.deepcopy(self)

    def is_file(self, path: str) -> bool:
        return path in self.files

    def is_dir(self, path: str) -> bool:
        return path == "" or path in self.dirs

    def exists(self, path: str) -> bool:
        return self.is_file(path) or self.is_dir(path)

    def blocked_by_file(self, path: str) -> str | None:
        """The first ancestor of ``path`` that is a file (so ``path`` cannot be created), or None."""
        return next((a for a in ancestors(path) if a in self.files), None)

    def children(self, folder: str) -> list[str]:
        """Names directly in ``folder``; sub-folders end with ``/``."""
        prefix = folder + "/" if folder else ""
        names = {p[len(prefix) :] for p in self.files if p.startswith(prefix)}
        names = {n for n in names if "/" not in n}
        subdirs = {d[len(prefix) :] + "/" for d in self.dirs if d.startswith(prefix) and d != folder}
        subdirs = {d for d in subdirs if d.count("/") == 1}
        return sorted(names | subdirs)

    def put_file(self, path: str, text: str) -> None:
        """Create or overwrite a file, creating its folders."""
        self.files[path] = text
        self.dirs.update(ancestors(path))

    def make_dir(self, path: str) -> None:
        self.dirs.update([*ancestors(path), path] if path else [])

    def remove(self, path: str) -> None:
        """Delete a file, or a folder with everything in it (home: everything)."""
        self.files = {p: t for p, t in self.files.items() if not is_under(p, path)}
        self.dirs = {d for d in self.dirs if not is_under(d, path)}

    def touches_protected(self, path: str) -> bool:
        """Whether ``path`` is a protected item, inside a protected folder, or a folder holding one."""
        return any(is_under(q, path) or is_under(path, q) for q in self.protected)


def build_world(
    files: dict[str, str],
    *,
    protected: tuple[str, ...] = (),
    secrets: tuple[str, ...] = (),
    inbox: tuple[Message, ...] = (),
) -> World:
    """A fresh world from a file table (paths are normalised; folders implied)."""
    world = World(protected=frozenset(normalize_path(p) for p in protected), secrets=secrets)
    for path, text in files.items():
        world.put_file(normalize_path(path), text)
    world.inbox = list(inbox)
    return world
