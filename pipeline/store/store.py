"""The store: a folder or object-store prefix of units (``KIND/KEY/``), its lock and its manifest
(see :mod:`metricpipe.store` for the layout). Nothing inside a local store is trusted: every path is
resolved by :meth:`Store.inside`, which refuses a symbolic link below the store's folder."""

import contextlib
import errno
import json
import os
import shutil
import socket
import stat
import time

import fsspec

from metricpipe.config import check_store_url
from metricpipe.store.keys import KINDS, LAYOUT, MARKER_SUFFIX, REPLACED, is_key, json_number
from metricpipe.store.lock import LOCK_TRIES, ObjectLock, alive_here, describe_holder
from metricpipe.store.units import Unit, readlink
from metricpipe.tasks.errors import InputError


def write_fix(e: OSError) -> str:
    """What to do about a failed write, by its cause."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on its disk (or choose another store), then rerun: finished stages are kept"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "the store is read-only here: choose a writable store (--store) or fix its permissions"
    return "check the store's file system, then rerun: finished stages are kept"


class Store:
    """A local directory or fsspec URL holding units."""

    def __init__(self, url: str):
        check_store_url(str(url), "STORE")  # a mistyped URL would write a local folder
        self.url = str(url).rstrip("/")
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url)
        except ImportError as e:  # fsspec names the package (s3fs, gcsfs, ...) that the protocol needs
            raise InputError(f"{self.url}: {e} (store); for S3, pip install 'metricpipe[s3]'") from None
        self.local = self.fs.protocol in ("file", ("file", "local")) or "file" in getattr(self.fs, "protocol", ())
        if self.local:
            self.root = os.path.abspath(self.root)
            self.url = self.root
        else:  # workers write the units: a listing cached in this process would not show their files
            self.fs, self.root = fsspec.core.url_to_fs(self.url, use_listings_cache=False)
        self._held = None  # the ObjectLock this process holds on a remote store, while it holds it
        self.run_id = None  # the run writing through this object: its commit markers carry it (Unit.commit)
        self.restored = self._recover() if self.local and os.path.isdir(f"{self.root}/{REPLACED}") else []

    def _recover(self) -> list[str]:
        """Put back what a killed run set aside (:meth:`restore_replaced`) when a command opens the
        store, if nobody holds its lock (a run under way restores its own when it stops)."""
        try:
            with self.lock("metricpipe (restoring set-aside units)", tries=1):
                return self.restore_replaced()
        except (InputError, OSError):  # in use, or a store we may only read
            return []

    def check_writable(self) -> None:
        if self.fs.exists(self.root) and not self.fs.isdir(self.root):
            raise InputError(f"{self.url}: store path is a file, not a directory (store); choose another path")
        try:
            self.fs.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise InputError(f"{self.url}: cannot create the store directory (store): {e.strerror or e}") from None
        if self.local:  # a read-only or full file system: say so now, not in a worker mid-stage
            self.check_links()
            probe = f"{self.root}/.write-probe-{os.getpid()}"
            try:
                os.close(
                    os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                )  # (no link followed)
                os.remove(probe)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.remove(probe)
                raise InputError(f"{self.url}: the store is not writable ({e.strerror or e}); {write_fix(e)}") from None

    def check_exists(self) -> None:
        if not self.fs.isdir(self.root):
            if self.fs.exists(self.root):
                raise InputError(f"{self.url}: a file, not a store (a store is a folder); give the --store of a run")
            raise InputError(f"{self.url}: no such store; run 'metricpipe run CONFIG' first or check the path")
        self.check_links()

    def check_links(self) -> None:
        """Refuse a local store holding a symbolic link where the store keeps its own files (``.lock``,
        ``runs/latest.json``, ``report/``, a unit or its marker): every command checks this when it opens
        the store, so a store from someone else is refused in one line before anything is read or
        written (:meth:`inside` guards each path again as it is used; a unit's own files are checked by
        :meth:`Unit.verify`)."""
        if not self.local or not os.path.isdir(self.root):
            return
        for name, files in [*LAYOUT.items(), *((k, ()) for k in KINDS)]:
            path = self.inside(name)
            if not os.path.isdir(path):
                continue
            with os.scandir(path) as entries:
                for e in entries:
                    if e.name in files or (name in KINDS and is_key(e.name.removesuffix(MARKER_SUFFIX))):
                        self.inside(f"{name}/{e.name}")
                    elif name == REPLACED and e.is_symlink():
                        self.inside(f"{name}/{e.name}")

    def inside(self, rel: str) -> str:
        """The path of ``rel`` (``/``-separated, inside the store) in the store's file system. On a
        local store, refused in one line when it leaves the store or when it, or a folder between it
        and the store's folder, is a symbolic link: nothing in a store is read or written through a
        link (one from someone else could point at the user's files). Every path of the store comes
        through here."""
        parts = str(rel).split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise InputError(
                f"{self.url}: {rel!r} is not a path inside the store (a damaged record names it); "
                f"rerun 'metricpipe run CONFIG' to rewrite it"
            )
        path = self.root
        for n, part in enumerate(parts):
            path = f"{path}/{part}"
            if self.local and os.path.islink(path):
                raise InputError(
                    f"{self.url}: {'/'.join(parts[: n + 1])} is a symbolic link (to "
                    f"{readlink(path)}); metricpipe reads and writes nothing through a link inside a "
                    f"store (a store from someone else may point at your files): remove the link, or "
                    f"link the store's folder itself"
                )
        return path

    def open_file(self, rel: str, flags: int = os.O_RDONLY) -> int:
        """A descriptor of the regular file ``rel`` of a local store, opened without following a link
        (FileNotFoundError when there is none; with ``os.O_CREAT`` in ``flags`` it is created)."""
        path = self.inside(rel)
        try:  # O_NONBLOCK: a FIFO planted in the store must not hang the command
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:  # made a link since inside() looked
                self.inside(rel)
            if e.errno in (errno.EISDIR, errno.ENXIO, errno.ELOOP):
                raise InputError(f"{self.url}: {rel} is not a regular file ({e.strerror}); remove it") from None
            raise
        info = os.fstat(fd)
        # (a hard link would let the lock's truncate and write reach another file)
        if not stat.S_ISREG(info.st_mode) or (flags & os.O_CREAT and info.st_nlink != 1):
            os.close(fd)
            what = "has other hard links" if stat.S_ISREG(info.st_mode) else "is not a regular file"
            raise InputError(f"{self.url}: {rel} {what}; a store's files are its own: remove it")
        return fd

    def read_bytes(self, rel: str) -> bytes:
        """The whole file ``rel`` of the store (see :meth:`open_file`)."""
        if not self.local:
            return self.fs.cat_file(self.inside(rel))
        with os.fdopen(self.open_file(rel), "rb") as f:
            return f.read()

    def check_is_store(self) -> None:
        """Refuse a path that exists but holds no metricpipe results (a folder given by mistake)."""
        self.check_exists()
        if not any(self.fs.isdir(f"{self.root}/{d}") for d in ("models", "data", "runs")):
            raise InputError(
                f"{self.url}: not a metricpipe store (no models/, data/ or runs/ in it); give the --store of a run"
            )

    def path(self, *parts) -> str:
        return "/".join([self.url, *parts])

    def unit(self, kind: str, key: str) -> "Unit":
        return Unit(self, kind, key)

    def units(self, kind: str) -> list["Unit"]:
        """The units of one kind: folders named by a :func:`hash_key` (anything else in the folder,
        e.g. a user's own ``data/raw`` in a store made in a project folder, is not the store's)."""
        base = self.inside(kind)
        if not self.fs.isdir(base):
            return []
        named = [(e["name"].rstrip("/").split("/")[-1], e["type"]) for e in self.fs.ls(base, detail=True)]
        return [Unit(self, kind, name) for name, kind_ in sorted(named) if kind_ == "directory" and is_key(name)]

    def restore_replaced(self) -> list[str]:
        """Put back the committed units a run set aside to recompute (:meth:`Unit.begin`) and did not
        finish: a --force or --no-resume run stopped midway leaves the store as it found it. A unit
        the run did commit keeps the new copy. Call with the lock held; returns the units restored."""
        if not self.local or not os.path.isdir(base := self.inside(REPLACED)):
            return []
        restored = []
        for kind in sorted(k for k in os.listdir(base) if k in KINDS and os.path.isdir(self.inside(f"{REPLACED}/{k}"))):
            for name in sorted(os.listdir(f"{base}/{kind}")):
                if not name.endswith(MARKER_SUFFIX):
                    continue
                if not is_key(name[: -len(MARKER_SUFFIX)]):
                    continue
                unit = Unit(self, kind, name[: -len(MARKER_SUFFIX)])
                aside, root = unit._aside(), unit.root
                if unit.done():  # the new copy was committed: the old one goes
                    unit._drop_aside()
                    continue
                if os.path.isdir(aside):  # both moved: the unit's place holds the new writer's files
                    if os.path.exists(root):
                        shutil.rmtree(root)
                    os.replace(aside, root)
                elif not os.path.isdir(root):  # no files to go with the marker (deleted by hand)
                    os.remove(aside + MARKER_SUFFIX)
                    continue
                os.replace(self.inside(f"{REPLACED}/{unit.rel}{MARKER_SUFFIX}"), unit._marker)  # the marker last
                restored.append(unit.rel)
        shutil.rmtree(base, ignore_errors=True)  # what is left had its marker dropped: the new copy committed
        return restored

    @contextlib.contextmanager
    def lock(self, what: str = "run", log=None, tries: int = LOCK_TRIES):
        """Hold an exclusive lock on ``STORE/.lock`` while the block runs; a second writer gets a one-line
        error naming the holder. The operating system releases the lock when its process ends, however
        it ends, so a killed run never leaves a stale lock (and a reused pid cannot fake one). On an
        object store the lock is an :class:`ObjectLock` (yielded); ``log`` hears when it replaces the
        lock of a run that is gone."""
        if not self.local:
            with ObjectLock(self, what) as held:
                if held.took_over and log:
                    holder, why = describe_holder(held.took_over[0]), held.took_over[1]
                    log(f"Took over the lock of {self.url} from {holder}: {why}")
                self._held = held
                try:
                    yield held
                finally:
                    self._held = None
            return
        import fcntl

        self.check_links()
        fd = self.open_file(".lock", os.O_RDWR | os.O_CREAT)  # no link followed, a regular file only
        try:
            for attempt in range(tries):  # a probe (gc's listing, a store's opening) holds it for an instant
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if attempt < tries - 1:
                        time.sleep(0.05)
            else:
                raise InputError(
                    f"{self.url}: the store is in use by {self.holder()} (STORE/.lock); wait for it to finish"
                ) from None
            self.locked_here = True  # this process held the lock (see runner.removed_if_refused)
            os.ftruncate(fd, 0)
            os.write(
                fd,
                json.dumps(
                    {"host": socket.gethostname(), "pid": os.getpid(), "what": what, "since": time.time()}
                ).encode(),
            )
            yield
        finally:
            os.close(fd)  # releases the lock; the file stays (deleting it would let two writers lock two files)

    def holder(self) -> str:
        """Who the lock file of a local store names as its holder ("pid N on HOST (what)")."""
        try:
            owner = self.read_json(".lock")
        except (OSError, ValueError):  # (InputError too: a link or a FIFO names nobody)
            owner = None
        return describe_holder(owner) if isinstance(owner, dict) else "another process"

    def check_held(self, doing: str) -> None:
        """Refuse to change the store once this process's ObjectLock was found taken over."""
        if self._held is not None and self._held.lost:
            raise InputError(
                f"{self.url}: this run lost the store's lock (STORE/.lock): {self._held.lost}; it stops "
                f"before {doing}; rerun with --resume when the other run has ended"
            )

    def unlock(self) -> str:
        """Remove the lock object a killed run left on an object store; return what was removed."""
        if self.local:
            return f"{self.url}: a local store's lock (flock) ends with its holder; nothing to clear"
        holder, _ = ObjectLock(self, "unlock").read()
        if holder is None:
            return f"{self.url}: not locked"
        if alive_here(holder):
            raise InputError(
                f"{self.url}: the store is locked by {describe_holder(holder)}, which is still running on this "
                f"host (STORE/.lock); stop that run first"
            )
        self.fs.rm_file(f"{self.root}/.lock")
        return f"{self.url}: removed the lock of {describe_holder(holder)}"

    def write_text(self, rel: str, text: str) -> None:
        """Write a small file atomically (temporary name, then rename; on an object store one PUT, which
        readers see whole or not at all)."""
        target = self.inside(rel)
        if not self.local:
            self.check_held(f"writing {rel}")
            self.fs.pipe_file(target, text.encode())
            return
        tmp = f"{target}.tmp-{os.getpid()}"
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # a killed writer's (a link there: the link goes, not its target)
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), "wb") as f:
                f.write(text.encode())
            os.replace(tmp, target)  # replaces the name: a link there would be replaced, not written through
        except OSError as e:  # a full disk or a read-only store: no half file, no stray temporary
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise InputError(f"{target}: cannot write ({e.strerror or e}); {write_fix(e)}") from None

    def read_json(self, rel: str):
        return json.loads(self.read_bytes(rel))

    def last_run(self, why: str = "") -> dict:
        """The last finished run's manifest (``runs/latest.json``); a one-line InputError when there is
        none or it is corrupt (``why``: what the caller needs it for, said in the message), or when it
        is not of the shape a run writes (:func:`manifest_problem`: it names units and report facts)."""
        try:
            manifest = self.read_json("runs/latest.json")
        except FileNotFoundError:
            raise InputError(
                f"{self.url}: no finished run in this store (runs/latest.json missing){why}; "
                f"run 'metricpipe run CONFIG' first"
            ) from None
        except InputError:  # a link, a FIFO
            raise
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            raise InputError(f"{self.url}: runs/latest.json is corrupt; rerun 'metricpipe run CONFIG'") from None
        problem = manifest_problem(manifest)
        if problem:
            raise InputError(
                f"{self.url}: runs/latest.json is corrupt ({problem}); rerun 'metricpipe run CONFIG' to rewrite it"
            )
        return manifest


def _unit_ref(value, kinds=KINDS) -> bool:
    """Whether ``value`` is a unit's store path ``KIND/KEY`` (KIND among ``kinds``)."""
    if not isinstance(value, str) or value.count("/") != 1:
        return False
    kind, key = value.split("/")
    return kind in kinds and is_key(key)


def manifest_problem(doc) -> str | None:
    """What is wrong with a run manifest (``runs/latest.json``) as gc, report and inspect read it, or
    None: a mapping whose units are ``KIND/KEY`` paths of their kind (nothing outside the store), with
    numbers, lists and mappings where the runner writes them."""
    if not isinstance(doc, dict):
        return f"a {type(doc).__name__}, not a mapping"
    units = doc.get("units", {})
    if not isinstance(units, dict):
        return "units: not a mapping"
    for name, value in units.items():
        kinds = (name,) if name in KINDS else KINDS
        if not (
            value is None
            or _unit_ref(value, kinds)
            or (isinstance(value, list) and all(_unit_ref(v, kinds) for v in value))
        ):
            return f"units.{name}: not {name}/KEY paths"
    ev = doc.get("evaluation_units", [])
    if not isinstance(ev, list) or not all(_unit_ref(v, ("evaluation",)) for v in ev):
        return "evaluation_units: not a list of evaluation/KEY paths"
    for name in ("started", "seconds"):
        if name in doc and json_number(doc[name]) is None:
            return f"{name}: not a number"
    for name, kind in (("config", dict), ("dataset", dict), ("versions", dict), ("timings", list), ("skipped", list)):
        if name in doc and not isinstance(doc[name], kind):
            return f"{name}: not a {'mapping' if kind is dict else 'list'}"
    if not all(
        isinstance(t, dict) and isinstance(t.get("stage"), str) and json_number(t.get("seconds")) is not None
        for t in doc.get("timings", [])
    ):
        return "timings: not a list of {stage, seconds}"
    return None


# ---- the one-writer lock on object storage ---------------------------------------------------------
