"""The store: one module owns its layout, its atomic commits and its Zarr access.

Layout (every result is a *unit* ``KIND/KEY/`` where KEY hashes everything the result depends on):

    STORE/data/KEY/          staged features (xarray Dataset in Zarr): features (sample, feature),
                             coordinates label, split, [group, id]
    STORE/statistics/KEY/    mean, covariance, class means, scatter matrices, PCA basis
    STORE/neighbours/KEY/    kNN graph of the train split: neighbours, distances, same_label
    STORE/shuffled/KEY/      the SGD learners' shuffled copy of the training rows
    STORE/models/KEY/        one trained estimator: its fitted arrays (dense or sparse) and state JSON
                             (`save_estimator`), attributes method, dim, params
    STORE/selection/KEY/     a spec's candidates' validation scores and the choice
    STORE/codes/KEY/         one model's codes for every sample (sample, code)
    STORE/evaluation/KEY/    one model's metrics (records.json)
    STORE/runs/latest.json   the last run's config and the units it used (`metricpipe gc` keeps those)
    STORE/runs/forcing.json  a --force run that has not finished yet: its stage and attempts (runner.forcing)
    STORE/report/            metrics.json, index.html, plots
    STORE/logs/              the workers' log files (local stores)

A unit is complete only when its marker ``KIND/KEY.committed.json`` exists, holds its key and
matches the digest of its own record it carries (:func:`record_digest`); the
marker sits beside the unit (so the unit stays a clean Zarr hierarchy) and is written last (write to
a temporary name, then rename), so a killed writer leaves a unit without a marker, which is never
read and is wiped before the unit is written again.

Zarr v3's default codecs carry no checksum and a missing chunk reads silently as the fill value, so
the marker also lists every file of the unit with its size and CRC-32 (``files``). A unit is reused
only after :meth:`Unit.verify` finds every listed file present and unchanged (``metricpipe inspect
--verify`` runs the same check over a whole store).

One run at a time writes a store: the run holds an exclusive ``flock`` on ``STORE/.lock`` (which also
records the holder's host and pid); the operating system drops it when that process ends. Object
stores have no flock: there ``STORE/.lock`` is an object created only if absent (a conditional PUT)
and refreshed by its holder, see :class:`ObjectLock`.

A store may come from someone else, so nothing inside it is trusted: every path in a local store is
resolved by :meth:`Store.inside`, which refuses a symbolic link anywhere below the store's folder
(``.lock`` linked to ``~/.bashrc``, ``report`` to another folder), files are opened without
following links and only when they are regular files, and a unit's check (:meth:`Unit.verify`) counts
a link, a special file or a file its commit does not list as damage. (The store's folder itself may
be a link: that one the user chose.)
"""
import contextlib
import errno
import functools
import hashlib
import json
import os
import shutil
import socket
import stat
import threading
import time
import uuid
import zlib
from pathlib import Path

import fsspec
import numpy as np

from metricpipe.tasks.errors import InputError


def stop_zarr_loop() -> None:
    """zarr's exit handler stops its I/O loop, waits 0.2 s for the loop's thread and then closes the
    loop: when the thread is still busy (a loaded machine, a read in flight) the close raises "Cannot
    close a running event loop", a traceback after a run that succeeded. This stops the loop first and
    waits up to 10 s; registered after zarr's own handler, it runs before it (atexit runs the last
    registered first), which then finds the loop stopped."""
    try:
        from zarr.core import sync
        lp, th = sync.loop[0], sync.iothread[0]
        if lp is not None and th is not None and th.is_alive():
            lp.call_soon_threadsafe(lp.stop)
            th.join(timeout=10)
    except Exception:  # noqa: BLE001 - best effort at exit: zarr's own handler follows
        pass


def _register_zarr_exit() -> None:
    import atexit

    import zarr.core.sync  # noqa: F401 - zarr registers its exit handler when this is first imported
    atexit.register(stop_zarr_loop)


_register_zarr_exit()

MARKER_SUFFIX = ".committed.json"
LOCK_TRIES = 20   # a local store's lock is tried for about a second before a second writer is refused
REPLACED = ".replaced"   # STORE/.replaced/KIND/KEY: committed units a run is recomputing (Unit.begin)
# every kind of unit a run writes (shuffled: the SGD learners' copy of the training rows; selection: the
# validation scores of a spec's candidates and its choice)
KINDS = ("data", "statistics", "neighbours", "shuffled", "models", "selection", "codes", "evaluation")
# what the store itself names below its folder (units are under KINDS): checked for links on opening
LAYOUT = {".lock": (), REPLACED: (), "runs": ("latest.json", "forcing.json"), "report": ("metrics.json", "index.html"),
          "logs": ()}


def _fix(e: OSError) -> str:
    """What to do about a failed write, by its cause."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on its disk (or choose another store), then rerun: finished stages are kept"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "the store is read-only here: choose a writable store (--store) or fix its permissions"
    return "check the store's file system, then rerun: finished stages are kept"


def is_key(name: str) -> bool:
    """Whether ``name`` is a unit key as :func:`hash_key` makes them (16 lower-case hex digits)."""
    return len(name) == 16 and all(c in "0123456789abcdef" for c in name)


# The libraries whose arithmetic is in a unit's numbers (BLAS and LAPACK come with numpy's and scipy's
# wheels; numba compiles the sparse kernel; faiss searches IVF graphs): their release (major.minor)
# is part of the code that made a result, as metricpipe's own is.
NUMERIC_LIBRARIES = ("numpy", "scipy", "scikit-learn", "numba", "faiss-cpu")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """What made a result: metricpipe's release and its numerical libraries' major.minor releases,
    e.g. ``0.3.8 numpy-2.2 scipy-1.15 scikit-learn-1.7 numba-0.62 faiss-cpu-1.12``."""
    from importlib import metadata
    from metricpipe import __version__
    parts = [__version__]
    for name in NUMERIC_LIBRARIES:
        try:
            parts.append(f"{name}-{'.'.join(metadata.version(name).split('.')[:2])}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name}-none")
    return " ".join(parts)


def hash_key(inputs: dict, version: str | None = None) -> str:
    """A short, stable key of a JSON-able description of a result's inputs and of the code that made
    it (:func:`code_version`: a result of another release, or made with another numpy, scipy, ... is
    never reused; bump ``version`` in pyproject.toml and ``metricpipe.__version__`` when a stage's
    output changes). ``version``: another :func:`code_version`'s key for the same inputs (the units it
    made, e.g. a model's codes)."""
    blob = json.dumps({"v": version or code_version(), **inputs}, sort_keys=True, default=_json_default)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def to_json(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=_json_default)


def record_digest(meta: dict) -> str:
    """The digest a commit marker holds of its own fields (all but ``record``): the marker's metadata
    (a model's class names, its parameters) is checked as its files are, so an edited or bit-flipped
    record is a damaged unit, not a model that predicts other labels."""
    body = json.dumps({k: v for k, v in meta.items() if k != "record"}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


class Store:
    """A local directory or fsspec URL holding units."""

    def __init__(self, url: str):
        from metricpipe.config import check_store_url
        check_store_url(str(url), "STORE")   # a mistyped URL would write a local folder
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
        except (InputError, OSError):   # in use, or a store we may only read
            return []

    def check_writable(self) -> None:
        if self.fs.exists(self.root) and not self.fs.isdir(self.root):
            raise InputError(f"{self.url}: store path is a file, not a directory (store); choose another path")
        try:
            self.fs.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise InputError(f"{self.url}: cannot create the store directory (store): {e.strerror or e}") from None
        if self.local:   # a read-only or full file system: say so now, not in a worker mid-stage
            self.check_links()
            probe = f"{self.root}/.write-probe-{os.getpid()}"
            try:
                os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))  # (no link followed)
                os.remove(probe)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.remove(probe)
                raise InputError(f"{self.url}: the store is not writable ({e.strerror or e}); {_fix(e)}") from None

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
            raise InputError(f"{self.url}: {rel!r} is not a path inside the store (a damaged record names it); "
                             f"rerun 'metricpipe run CONFIG' to rewrite it")
        path = self.root
        for n, part in enumerate(parts):
            path = f"{path}/{part}"
            if self.local and os.path.islink(path):
                raise InputError(f"{self.url}: {'/'.join(parts[:n + 1])} is a symbolic link (to "
                                 f"{_readlink(path)}); metricpipe reads and writes nothing through a link inside a "
                                 f"store (a store from someone else may point at your files): remove the link, or "
                                 f"link the store's folder itself")
        return path

    def open_file(self, rel: str, flags: int = os.O_RDONLY) -> int:
        """A descriptor of the regular file ``rel`` of a local store, opened without following a link
        (FileNotFoundError when there is none; with ``os.O_CREAT`` in ``flags`` it is created)."""
        path = self.inside(rel)
        try:   # O_NONBLOCK: a FIFO planted in the store must not hang the command
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:   # made a link since inside() looked
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
            raise InputError(f"{self.url}: not a metricpipe store (no models/, data/ or runs/ in it); give the --store "
                             f"of a run")

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
                if not is_key(name[:-len(MARKER_SUFFIX)]):
                    continue
                unit = Unit(self, kind, name[:-len(MARKER_SUFFIX)])
                aside, root = unit._aside(), unit._root
                if unit.done():              # the new copy was committed: the old one goes
                    unit._drop_aside()
                    continue
                if os.path.isdir(aside):     # both moved: the unit's place holds the new writer's files
                    if os.path.exists(root):
                        shutil.rmtree(root)
                    os.replace(aside, root)
                elif not os.path.isdir(root):   # no files to go with the marker (deleted by hand)
                    os.remove(aside + MARKER_SUFFIX)
                    continue
                os.replace(self.inside(f"{REPLACED}/{unit.rel}{MARKER_SUFFIX}"), unit._marker)   # the marker last
                restored.append(unit.rel)
        shutil.rmtree(base, ignore_errors=True)   # what is left had its marker dropped: the new copy committed
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
                    log(f"Took over the lock of {self.url} from {_holder(held.took_over[0])}: {held.took_over[1]}")
                self._held = held
                try:
                    yield held
                finally:
                    self._held = None
            return
        import fcntl
        self.check_links()
        fd = self.open_file(".lock", os.O_RDWR | os.O_CREAT)   # no link followed, a regular file only
        try:
            for attempt in range(tries):   # a probe (gc's listing, a store's opening) holds it for an instant
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if attempt < tries - 1:
                        time.sleep(0.05)
            else:
                raise InputError(f"{self.url}: the store is in use by {self.holder()} (STORE/.lock); wait for it to "
                                 f"finish") from None
            self.locked_here = True   # this process held the lock (see runner.removed_if_refused)
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "what": what,
                                     "since": time.time()}).encode())
            yield
        finally:
            os.close(fd)  # releases the lock; the file stays (deleting it would let two writers lock two files)

    def holder(self) -> str:
        """Who the lock file of a local store names as its holder ("pid N on HOST (what)")."""
        try:
            owner = self.read_json(".lock")
        except (OSError, ValueError):   # (InputError too: a link or a FIFO names nobody)
            owner = None
        return _holder(owner) if isinstance(owner, dict) else "another process"

    def check_held(self, doing: str) -> None:
        """Refuse to change the store once this process's ObjectLock was found taken over."""
        if self._held is not None and self._held.lost:
            raise InputError(f"{self.url}: this run lost the store's lock (STORE/.lock): {self._held.lost}; it stops "
                             f"before {doing}; rerun with --resume when the other run has ended")

    def unlock(self) -> str:
        """Remove the lock object a killed run left on an object store; return what was removed."""
        if self.local:
            return f"{self.url}: a local store's lock (flock) ends with its holder; nothing to clear"
        holder, _ = ObjectLock(self, "unlock").read()
        if holder is None:
            return f"{self.url}: not locked"
        if _alive_here(holder):
            raise InputError(f"{self.url}: the store is locked by {_holder(holder)}, which is still running on this "
                             f"host (STORE/.lock); stop that run first")
        self.fs.rm_file(f"{self.root}/.lock")
        return f"{self.url}: removed the lock of {_holder(holder)}"

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
                os.unlink(tmp)   # a killed writer's (a link there: the link goes, not its target)
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), "wb") as f:
                f.write(text.encode())
            os.replace(tmp, target)   # replaces the name: a link there would be replaced, not written through
        except OSError as e:      # a full disk or a read-only store: no half file, no stray temporary
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise InputError(f"{target}: cannot write ({e.strerror or e}); {_fix(e)}") from None

    def read_json(self, rel: str):
        return json.loads(self.read_bytes(rel))

    def last_run(self, why: str = "") -> dict:
        """The last finished run's manifest (``runs/latest.json``); a one-line InputError when there is
        none or it is corrupt (``why``: what the caller needs it for, said in the message), or when it
        is not of the shape a run writes (:func:`manifest_problem`: it names units and report facts)."""
        try:
            manifest = self.read_json("runs/latest.json")
        except FileNotFoundError:
            raise InputError(f"{self.url}: no finished run in this store (runs/latest.json missing){why}; "
                             f"run 'metricpipe run CONFIG' first") from None
        except InputError:   # a link, a FIFO
            raise
        except ValueError:   # JSONDecodeError, UnicodeDecodeError
            raise InputError(f"{self.url}: runs/latest.json is corrupt; rerun 'metricpipe run CONFIG'") from None
        problem = manifest_problem(manifest)
        if problem:
            raise InputError(f"{self.url}: runs/latest.json is corrupt ({problem}); rerun 'metricpipe run CONFIG' to "
                             f"rewrite it")
        return manifest


def _unit_ref(value, kinds=KINDS) -> bool:
    """Whether ``value`` is a unit's store path ``KIND/KEY`` (KIND among ``kinds``)."""
    if not isinstance(value, str) or value.count("/") != 1:
        return False
    kind, key = value.split("/")
    return kind in kinds and is_key(key)


def _number(value) -> float | None:
    """``value`` as a finite float, or None when it is not a finite number (JSON's 1e400 is inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if np.isfinite(value) else None


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
        if not (value is None or _unit_ref(value, kinds) or
                (isinstance(value, list) and all(_unit_ref(v, kinds) for v in value))):
            return f"units.{name}: not {name}/KEY paths"
    ev = doc.get("evaluation_units", [])
    if not isinstance(ev, list) or not all(_unit_ref(v, ("evaluation",)) for v in ev):
        return "evaluation_units: not a list of evaluation/KEY paths"
    for name in ("started", "seconds"):
        if name in doc and _number(doc[name]) is None:
            return f"{name}: not a number"
    for name, kind in (("config", dict), ("dataset", dict), ("versions", dict), ("timings", list), ("skipped", list)):
        if name in doc and not isinstance(doc[name], kind):
            return f"{name}: not a {'mapping' if kind is dict else 'list'}"
    if not all(isinstance(t, dict) and isinstance(t.get("stage"), str) and _number(t.get("seconds")) is not None
               for t in doc.get("timings", [])):
        return "timings: not a list of {stage, seconds}"
    return None


# ---- the one-writer lock on object storage ---------------------------------------------------------

LOCK_LEASE = 120.0    # seconds: a lock on an object store not refreshed for this long belongs to a run that is gone
LOCK_REFRESH = 20.0   # seconds between the holder's refreshes (several may fail within one lease)


class ObjectLock:
    """The one-writer lock of a store on object storage (S3 and compatible servers).

    ``STORE/.lock`` is an object written only if absent (``If-None-Match: *``), holding the holder's
    host, pid, command and token; a thread rewrites it every LOCK_REFRESH seconds, each time only if
    it is still the object this holder last wrote (``If-Match`` its ETag), and the holder deletes it
    on exit. A run killed before that leaves it behind; the next writer takes it over (again
    ``If-Match``, so of two writers that both find it stale one wins) when its holder is gone: on
    the same host, its process no longer runs; elsewhere, it was not refreshed for LOCK_LEASE
    seconds (hosts' clocks must agree to well within that), or its record holds no time of refresh
    or one more than LOCK_LEASE ahead (a damaged record no holder wrote). Otherwise the second writer gets a
    one-line error naming the holder. A holder whose refresh finds the lock taken (it was paused
    past its lease) writes no further marker, manifest or report (:meth:`Store.write_text`).

    Other fsspec backends have no conditional overwrite: there the same steps compare the holder's
    token just before writing, which leaves a narrow race between two writers starting together.
    """

    def __init__(self, store: Store, what: str):
        self.fs, self.url, self.path = store.fs, store.url, f"{store.root}/.lock"
        self.conditional = "s3" in _protocols(store.fs)
        pid = os.getpid()
        self.me = {"host": socket.gethostname(), "pid": pid, "pid_started": _started(pid), "what": what,
                   "since": time.time(), "token": uuid.uuid4().hex}
        self.etag = None
        self.lost = None       # why this holder no longer holds the lock, once that is found
        self.took_over = None  # (record, why) of the stale lock this holder replaced
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        for _ in range(5):
            self.etag = self._write()
            if self.etag is not None:
                break
            holder, etag = self.read()
            if holder is None:  # released between our attempt and the read: try again
                continue
            why = _gone(holder)
            if why is None:
                refreshed = _number(holder.get("refreshed"))
                ago = f", lock refreshed {time.time() - refreshed:.0f} s ago" if refreshed is not None else ""
                raise InputError(f"{self.url}: the store is in use by {_holder(holder)}{ago} (STORE/.lock); wait "
                                 f"for it to finish, or if that run is gone 'metricpipe unlock {self.url}' (a lock "
                                 f"not refreshed for {LOCK_LEASE:.0f} s is taken over)")
            self.etag = self._write(expect=(etag, holder.get("token")))
            if self.etag is not None:
                self.took_over = (holder, why)
                break
        else:
            raise InputError(f"{self.url}: the store's lock (STORE/.lock) changed hands 5 times while this run tried "
                             f"to take it; another run is starting, wait for it to finish")
        self._thread = threading.Thread(target=self._refresh, name="metricpipe-store-lock", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        if self.lost:
            return
        try:
            holder, _ = self.read()
            if holder is not None and holder.get("token") == self.me["token"]:
                self.fs.rm_file(self.path)
        except OSError:  # unreachable store: the lock lapses after LOCK_LEASE, so the next run can start
            pass

    def read(self) -> tuple[dict | None, str | None]:
        """(the lock's record, its ETag); (None, None) when there is no lock. The ETag is read first, so
        a conditional write with it fails if the record read is not the one it names."""
        try:
            etag = self.fs.info(self.path).get("ETag")
            raw = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None, None
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        return (record if isinstance(record, dict) else {}), etag

    def _write(self, expect: tuple | None = None) -> str | None:
        """Write this holder's record: create the lock (``expect`` None) or replace the one whose
        (ETag, token) is ``expect``. Returns the new ETag ("" where the backend has none), or None
        when the lock is not what was expected (another run's)."""
        body = json.dumps({**self.me, "refreshed": time.time()}).encode()
        try:
            if expect is None:
                out = self.fs.pipe_file(self.path, body, mode="create")
            elif self.conditional:
                out = self.fs.pipe_file(self.path, body, IfMatch=expect[0])
            else:
                holder, _ = self.read()
                if holder is None or holder.get("token") != expect[1]:
                    return None
                out = self.fs.pipe_file(self.path, body)
        except OSError as e:
            if _precondition_failed(e):
                return None
            raise
        etag = out.get("ETag") if isinstance(out, dict) else None
        if etag is None and self.conditional:
            etag = self.fs.info(self.path).get("ETag")
        return etag or ""

    def _refresh(self) -> None:
        while not self._stop.wait(LOCK_REFRESH):
            try:
                etag = self._write(expect=(self.etag, self.me["token"]))
                if etag is None:
                    holder, etag = self.read()
                    if holder is None or holder.get("token") != self.me["token"]:
                        self.lost = f"taken over by {_holder(holder)}" if holder else "removed by someone else"
                        return
                    # else: our own last refresh landed but its reply was lost; go on from what it wrote
            except Exception:  # a failed refresh (network) is retried; the lease allows several
                continue
            self.etag = etag


def _protocols(fs) -> tuple:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _precondition_failed(e: OSError) -> bool:
    """Whether a write was refused because its condition (If-None-Match / If-Match) did not hold."""
    if isinstance(e, FileExistsError):
        return True
    response = getattr(e.__cause__, "response", None) or {}
    return response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict")


def _holder(record: dict) -> str:
    return f"pid {record.get('pid')} on {record.get('host')} ({record.get('what')})"


def _started(pid: int) -> float | None:
    """The start time of process ``pid`` (it tells a reused pid from the holder), None if none runs."""
    import psutil
    try:
        p = psutil.Process(int(pid))
        return None if p.status() == psutil.STATUS_ZOMBIE else p.create_time()
    except (psutil.NoSuchProcess, ValueError, TypeError):
        return None
    except psutil.AccessDenied:
        return -1.0


def _alive_here(record: dict) -> bool:
    """Whether the lock's holder is a process still running on this host."""
    if record.get("host") != socket.gethostname():
        return False
    started = _started(record.get("pid"))
    return started is not None and (started == -1.0 or abs(started - (_number(record.get("pid_started")) or 0)) < 1)


def _gone(record: dict) -> str | None:
    """Why the lock ``record`` belongs to a run that is gone, or None while it may be running."""
    if record.get("host") == socket.gethostname():
        return None if _alive_here(record) else f"pid {record.get('pid')} no longer runs on this host"
    refreshed = _number(record.get("refreshed"))
    if refreshed is None:   # a holder writes its clock's time: this record is damaged, so nobody refreshes it
        return f"its record's refresh time {record.get('refreshed')!r} is not a time"
    age = time.time() - refreshed
    if age < -LOCK_LEASE:   # hosts' clocks agree to well within a lease: no holder wrote this
        return f"its record's refresh time is {-age:.0f} s in the future"
    return f"not refreshed for {age:.0f} s" if age > LOCK_LEASE else None


class Unit:
    """One keyed result in the store."""

    def __init__(self, store: Store, kind: str, key: str):
        self.store, self.kind, self.key = store, kind, key
        self.rel = f"{kind}/{key}"
        self.url = store.path(kind, key)

    @property
    def _root(self) -> str:
        """The unit's folder (:meth:`Store.inside`: never through a link)."""
        return self.store.inside(self.rel)

    @property
    def _marker(self) -> str:
        return self.store.inside(self.rel + MARKER_SUFFIX)

    def exists(self) -> bool:
        """Whether anything of the unit is on disk (committed or left by an interrupted writer)."""
        return self.store.fs.exists(self._root)

    def done(self) -> bool:
        try:
            meta = self.meta()
        except (FileNotFoundError, ValueError, OSError):   # JSONDecodeError, UnicodeDecodeError (a flipped bit)
            return False
        if not isinstance(meta, dict):
            return False
        # the marker's digest of its own record must match; markers before 0.3.8 have none (and a
        # version without the libraries' releases), a later one without it is damaged
        if "record" not in meta and "numpy-" in str(meta.get("version", "")):
            return False
        return meta.get("key") == self.key and meta.get("record", record_digest(meta)) == record_digest(meta)

    def marker_damaged(self) -> bool:
        """Whether the commit marker exists but is not a whole record of this unit (truncated by a full
        disk or a torn copy): then the unit is not committed, and verification says so."""
        if not self.store.fs.exists(self._marker):
            return False
        return not self.done()

    def meta(self) -> dict:
        return self.store.read_json(f"{self.rel}{MARKER_SUFFIX}")

    def begin(self) -> None:
        """Wipe anything a killed writer left and create the unit's directory. A committed unit (which
        a --force, --no-resume or --repair run recomputes) is set aside on a local store, not deleted:
        it comes back if the run stops before the new one commits (:meth:`Store.restore_replaced`)."""
        if self.store.local and self.done() and os.path.isdir(self._root):   # (a unit whose folder is
            self._set_aside()                                                 # gone has nothing to keep)
        self.remove(f"writing {self.rel}")
        self.store.fs.makedirs(self._root, exist_ok=True)

    def _aside(self) -> str:
        return self.store.inside(f"{REPLACED}/{self.rel}")

    def _set_aside(self) -> None:
        """Move the committed unit under STORE/.replaced/: its marker first, so that a process killed
        between the two moves leaves an unfinished unit here and a marker there, which
        :meth:`Store.restore_replaced` puts back together."""
        self.store.check_held(f"writing {self.rel}")
        aside = self._aside()
        aside_marker = self.store.inside(f"{REPLACED}/{self.rel}{MARKER_SUFFIX}")
        os.makedirs(os.path.dirname(aside), exist_ok=True)
        for path in (aside_marker, aside):   # an older set-aside copy of this unit
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
        os.replace(self._marker, aside_marker)
        os.replace(self._root, aside)

    def _drop_aside(self) -> None:
        if not self.store.local:
            return
        aside = self._aside()
        marker = self.store.inside(f"{REPLACED}/{self.rel}{MARKER_SUFFIX}")
        if os.path.exists(marker):
            os.remove(marker)     # marker first: a half-removed copy is never restored
            shutil.rmtree(aside, ignore_errors=True)

    def remove(self, doing: str | None = None) -> None:
        """Remove the unit: its commit marker first, so that a writer killed midway leaves an
        unfinished unit (wiped by the next writer), never a committed one with files missing."""
        self.store.check_held(doing or f"removing {self.rel}")
        fs, marker, root = self.store.fs, self._marker, self._root
        if fs.exists(marker):
            fs.rm(marker)
        if fs.exists(root):
            fs.rm(root, recursive=True)

    def nbytes(self) -> int:
        """Bytes of the unit's files and its commit marker."""
        fs, marker = self.store.fs, self._marker
        return sum(self.file_sizes().values()) + (int(fs.info(marker)["size"]) if fs.exists(marker) else 0)

    def discard(self) -> None:
        """Remove an uncommitted unit's files (a candidate whose fit failed: nothing to resume). Best
        effort: a cancelled task still running may write a block after it (an unfinished unit, which
        a resume recomputes), and a file it adds meanwhile must not replace the caller's error."""
        if not self.done() and self.store.fs.exists(self._root):
            with contextlib.suppress(OSError):
                self.store.fs.rm(self._root, recursive=True)

    def commit(self, meta: dict, sums: dict | None = None) -> None:
        """Mark the unit complete (the marker is written last and atomically) with its files' checksums
        (``sums``: those already taken elsewhere, e.g. by workers; the rest are taken here)."""
        run = {"run": self.store.run_id} if self.store.run_id else {}
        record = json.loads(to_json({**meta, "key": self.key, "kind": self.kind, "committed": time.time(), **run,
                                     "version": code_version(), "files": self.checksums(sums)}))
        self.store.write_text(f"{self.rel}{MARKER_SUFFIX}", to_json({**record, "record": record_digest(record)}))
        self._drop_aside()   # the unit it replaces, set aside by begin()

    def file_sizes(self) -> dict:
        """{path inside the unit: size in bytes} for every regular file of the unit (:meth:`tree`)."""
        return self.tree()[0]

    def tree(self) -> tuple[dict, dict]:
        """({path inside the unit: size} of its regular files, {path: what it is} of anything else in
        it: a symbolic link (never followed), a FIFO, a device). Object stores hold files only."""
        root = self._root
        if not self.store.local:
            found = self.store.fs.find(root, detail=True)
            return {path[len(root) + 1:]: int(info["size"]) for path, info in sorted(found.items())}, {}
        files, odd = {}, {}

        def walk(folder: str, prefix: str) -> None:
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except FileNotFoundError:
                return
            except NotADirectoryError:
                odd[prefix.rstrip("/")] = "a file, not a folder"
                return
            for e in entries:
                name = prefix + e.name
                if e.is_symlink():
                    odd[name] = f"a symbolic link (to {_readlink(e.path)})"
                elif e.is_dir(follow_symlinks=False):
                    walk(e.path, name + "/")
                elif e.is_file(follow_symlinks=False):
                    files[name] = int(e.stat(follow_symlinks=False).st_size)
                else:
                    odd[name] = "not a regular file"
        walk(root, "")
        return dict(sorted(files.items())), odd

    def checksums(self, sums: dict | None = None, names=None) -> dict:
        """{path inside the unit: [size, CRC-32]} for ``names`` (default every file of the unit)."""
        sums = sums or {}
        names = self.file_sizes() if names is None else names
        return {rel: sums[rel] if rel in sums else size_crc(self.store.fs, f"{self._root}/{rel}") for rel in names}

    def verify(self, sums: dict | None = None, keep=None) -> list[str]:
        """Problems with a committed unit's files: missing, resized or changed since the commit
        (``sums``: checksums already taken of some of them, e.g. by workers; ``keep``: a test on
        the file's name within the unit, to check only those files)."""
        listed = self.meta().get("files")
        try:
            found, odd = self.tree()
        except InputError as e:   # the unit's folder (or its kind's) is a link
            return [str(e).removeprefix(f"{self.store.url}: ")]
        bad = [f"{self.rel}/{rel}: {what}; a unit holds regular files only (a store from someone else?)"
               for rel, what in odd.items()]
        if listed is None:  # committed before checksums were recorded: nothing to compare
            return bad
        if not _file_list(listed):
            return bad + [f"{self.rel}{MARKER_SUFFIX}: its list of files is malformed"]
        # a file the commit does not list is damage too: an array added to a model's group is read
        bad += [f"{self.rel}/{rel}: not among the files of its commit (added since)" for rel in found
                if rel not in listed]
        root = self._root
        for rel, (size, crc) in listed.items():
            if (keep is not None and not keep(rel)) or rel in odd:
                continue
            if rel not in found:
                bad.append(f"{self.rel}/{rel}: missing (zarr would read it as the fill value)")
                continue
            try:
                now_size, now_crc = (sums or {}).get(rel) or size_crc(self.store.fs, f"{root}/{rel}")
            except FileNotFoundError:
                bad.append(f"{self.rel}/{rel}: missing (zarr would read it as the fill value)")
                continue
            if now_size != size:
                bad.append(f"{self.rel}/{rel}: {now_size} bytes, {size} at commit")
            elif now_crc != crc:
                bad.append(f"{self.rel}/{rel}: checksum differs from the commit's (corrupt)")
        return bad

    def write_json(self, name: str, obj) -> None:
        self.store.write_text(f"{self.rel}/{name}", to_json(obj))

    def read_json(self, name: str):
        return self.store.read_json(f"{self.rel}/{name}")


def _file_list(listed) -> bool:
    """Whether a commit's ``files`` is {name: [size, CRC-32]} (a hand-made marker may hold anything)."""
    return isinstance(listed, dict) and all(
        isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        for v in listed.values())


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def size_crc(fs, path: str) -> list[int]:
    """[size, CRC-32] of one file; raises FileNotFoundError."""
    with fs.open(path, "rb") as f:
        data = f.read()
    return [len(data), zlib.crc32(data)]


def size_crcs(fs, root: str, names: list) -> dict:
    """{name: [size, CRC-32] or None when missing} for files under ``root`` (a worker's share)."""
    out = {}
    for rel in names:
        try:
            out[rel] = size_crc(fs, f"{root}/{rel}")
        except FileNotFoundError:
            out[rel] = None
    return out


# ---- Zarr helpers (the only place that talks to zarr directly) -------------------------------------

def open_array(url: str, mode: str = "r"):
    import zarr
    return zarr.open_array(store=url, mode=mode)


# Row-block arrays are LZ4-compressed only where that saves a third of the bytes. Decoding costs
# ~0.045 s per 64 MB here: on dense float descriptors (1.07x) it doubles a block's read (0.052 s bare,
# 0.097 s LZ4, measured), while on Fashion-MNIST (1.7x) the smaller file pays for it (990 MB/s LZ4
# against 963 MB/s bare) and the store is 1.7x smaller.
COMPRESS_MIN_RATIO = 1.5


def row_codecs(sample: np.ndarray | None = None) -> tuple:
    """Compression of the row-block arrays (features, codes, graphs): Blosc LZ4 with byte shuffle,
    or none when ``sample`` (a few thousand rows as they will be stored) compresses less than
    COMPRESS_MIN_RATIO. Every stage reads these again, the kNN stage once per query piece, so
    decoding speed matters more than size (Zarr's default zstd reads Fashion-MNIST at 500 MB/s)."""
    from zarr.codecs import BloscCodec
    if sample is not None and lz4_ratio(sample) < COMPRESS_MIN_RATIO:
        return ()
    return (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)


def lz4_ratio(sample: np.ndarray) -> float:
    """Raw bytes over Blosc-LZ4-shuffle bytes for ``sample``."""
    from numcodecs import Blosc
    raw = np.ascontiguousarray(sample)
    if raw.nbytes == 0:
        return 1.0
    return raw.nbytes / len(Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE).encode(raw))


def create_array(url: str, shape, chunks, dtype, fill_value=None, attrs=None, rows: bool = False,
                 sample: np.ndarray | None = None):
    """A new array; ``rows`` marks a row-block array that stages read repeatedly, compressed when
    ``sample`` says it pays (see row_codecs)."""
    import zarr
    extra = {"compressors": row_codecs(sample)} if rows else {}
    a = zarr.create_array(store=url, shape=shape, chunks=chunks, dtype=dtype, fill_value=fill_value,
                          overwrite=True, **extra)
    if attrs:
        a.attrs.update(attrs)
    return a


def save_arrays(url: str, arrays: dict, attrs: dict | None = None) -> None:
    """Write small arrays (statistics, models) as one Zarr group."""
    import zarr
    g = zarr.open_group(store=url, mode="w")
    scalars = {}
    for name, value in arrays.items():
        value = np.asarray(value)
        if value.ndim == 0:
            scalars[name] = value.item()
            continue
        a = g.create_array(name, shape=value.shape, dtype=value.dtype, chunks=value.shape)
        a[...] = value
    g.attrs.update(json.loads(to_json({**(attrs or {}), "scalars": scalars})))


def load_scalar(url: str, name: str):
    """One scalar that :func:`save_arrays` kept in the group's attributes (no array is read)."""
    import zarr
    return zarr.open_group(store=url, mode="r").attrs["scalars"][name]


def load_arrays(url: str, names: tuple | None = None) -> tuple[dict, dict]:
    """(arrays and scalars, attributes) of a group saved by :func:`save_arrays`; ``names``: only those
    (a learner's ``reads_statistics``: a 4,096-d covariance is 134 MB it need not read)."""
    import zarr
    g = zarr.open_group(store=url, mode="r")
    attrs = dict(g.attrs)
    scalars = attrs.pop("scalars", {})
    keep = (lambda k: True) if names is None else (lambda k: k in names)
    return {**{k: v for k, v in scalars.items() if keep(k)}, **{k: a[...] for k, a in g.arrays() if keep(k)}}, attrs


def read_rows(url: str, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` of a stored 2-D array; only the chunks holding them are read, one at a
    time. (A single orthogonal selection lets zarr decode its whole batch of chunks at once: 20,000
    rows spread over a 2.5M x 128 array took 612 MB for a 10 MB result, which killed 1 GB workers.)"""
    arr = open_array(url)
    idx = np.asarray(idx, np.int64)
    if len(idx) > 1 and (np.diff(idx) < 0).any():
        order = np.argsort(idx, kind="stable")
        out = np.empty((len(idx),) + arr.shape[1:], arr.dtype)
        out[order] = read_rows(url, idx[order])
        return out
    step = arr.chunks[0]
    out = np.empty((len(idx),) + arr.shape[1:], arr.dtype)
    cuts = np.searchsorted(idx, np.arange(0, arr.shape[0] + step, step))
    for c in np.flatnonzero(np.diff(cuts)):
        lo, hi = cuts[c], cuts[c + 1]
        out[lo:hi] = arr.get_orthogonal_selection((idx[lo:hi], slice(None)))
    return out


def array_names(url: str) -> set:
    """Names of the arrays in a Zarr group."""
    import zarr
    return {k for k, _ in zarr.open_group(store=url, mode="r").arrays()}


def read_attrs(url: str) -> dict:
    """The attributes of a Zarr group, without reading its arrays."""
    import zarr
    return dict(zarr.open_group(store=url, mode="r").attrs)


def row_chunks(n_rows: int, chunk_rows: int) -> list[tuple[int, int]]:
    return [(a, min(a + chunk_rows, n_rows)) for a in range(0, n_rows, chunk_rows)]


def chunk_rows_for(n_features: int, chunk_mb: float, itemsize: int = 4) -> int:
    """Rows per chunk so that one chunk of float32 features is about ``chunk_mb`` MB."""
    return max(1, int(chunk_mb * 1e6 // (n_features * itemsize)))


def row_chunk(chunk_rows: int, n_rows: int) -> int:
    """Rows per chunk of an ``n_rows``-row array: ``chunk_rows``, but no more than the rows. Zarr stores
    and decodes an edge chunk whole, so a 64 MB chunk over 1,150 rows made every read decode 64 MB."""
    return min(chunk_rows, max(1, n_rows))


def local_path(url: str) -> Path | None:
    return Path(url) if "://" not in url else None



# ---- fitted estimators ---------------------------------------------------------------------------------

def save_estimator(url: str, est, attrs: dict | None = None) -> None:
    """Store a fitted learner: its fitted attributes (arrays as Zarr arrays, scipy sparse arrays as
    their CSC parts, everything else as JSON), its method name and parameters. ``attrs`` adds facts
    about the run (the spec, the staged data's normalisation, ...)."""
    import scipy.sparse
    arrays, state, sparse = {}, {}, []
    for name, value in est.fitted_state().items():
        if scipy.sparse.issparse(value):
            W = value.tocsc()
            small = np.uint16 if W.shape[0] <= np.iinfo(np.uint16).max else np.int32
            arrays.update({f"{name}.data": W.data, f"{name}.indices": W.indices.astype(small),
                           f"{name}.indptr": W.indptr, f"{name}.shape": np.array(W.shape)})
            sparse.append(name)
        elif isinstance(value, np.ndarray) and value.ndim > 0:
            arrays[name] = value
        elif isinstance(value, np.ndarray):
            state[name] = value.item()
        else:
            state[name] = value
    params = {k: v for k, v in est.get_params(deep=False).items()}
    save_arrays(url, arrays, {**(attrs or {}), "method": est.method, "params": params, "state": state,
                              "sparse_arrays": sparse})


def load_estimator(url: str):
    """The fitted learner stored at ``url`` by :func:`save_estimator`."""
    import scipy.sparse
    from metricpipe.tasks.registry import estimator_class
    arrays, attrs = load_arrays(url)
    if "method" not in attrs or "params" not in attrs:
        raise InputError(f"{url}: this model was stored by metricpipe before 0.2, which kept no estimator; "
                         f"rerun its config to train it again")
    state = dict(attrs.get("state", {}))
    for name in attrs.get("sparse_arrays", []):
        state[name] = scipy.sparse.csc_array(
            (arrays.pop(f"{name}.data"), arrays.pop(f"{name}.indices").astype(np.int32), arrays.pop(f"{name}.indptr")),
            shape=tuple(int(s) for s in arrays.pop(f"{name}.shape")))
    state.update(arrays)
    cls = estimator_class(attrs["method"], attrs["params"])
    return cls.from_state(attrs["params"], state)


def save_model(url: str, est, spec: dict, fit_seconds: float, **extra) -> dict:
    """Store a fitted learner for the encode and evaluate stages; returns the train stage's record
    of it (output dimension, how codes compare, encoder cost, fit time and ``extra`` facts)."""
    dim = int(est._n_features_out)
    info = {"dim": dim, "score": est.code_metric, "fit_seconds": float(fit_seconds), "cost": est.cost(),
            "refit": est.refit_params(), **extra}
    M = getattr(est, "M_", None)
    if M is not None:  # bilinear (SL-NE, SL-DE): the encode stage also writes the exact views
        info["bilinear_dim"] = int(M.shape[0])
    save_estimator(url, est, {"spec": spec, "dim": dim, "score": est.code_metric})
    return info
