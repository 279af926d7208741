"""A unit ``KIND/KEY/`` of the store: begun, committed (its marker, written last, lists every file with
its size and CRC-32), verified before reuse, set aside while a run recomputes it."""

import contextlib
import json
import os
import shutil
import time

from metricpipe.store.arrays import size_crc
from metricpipe.store.keys import MARKER_SUFFIX, REPLACED, code_version, record_digest, to_json
from metricpipe.tasks.errors import InputError


class Unit:
    """One keyed result in the store."""

    def __init__(self, store, kind: str, key: str):
        self.store, self.kind, self.key = store, kind, key
        self.rel = f"{kind}/{key}"
        self.url = store.path(kind, key)

    @property
    def root(self) -> str:
        """The unit's folder (:meth:`Store.inside`: never through a link)."""
        return self.store.inside(self.rel)

    @property
    def _marker(self) -> str:
        return self.store.inside(self.rel + MARKER_SUFFIX)

    def exists(self) -> bool:
        """Whether anything of the unit is on disk (committed or left by an interrupted writer)."""
        return self.store.fs.exists(self.root)

    def done(self) -> bool:
        try:
            meta = self.meta()
        except (FileNotFoundError, ValueError, OSError):  # JSONDecodeError, UnicodeDecodeError (a flipped bit)
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
        if self.store.local and self.done() and os.path.isdir(self.root):  # (a unit whose folder is
            self._set_aside()  # gone has nothing to keep)
        self.remove(f"writing {self.rel}")
        self.store.fs.makedirs(self.root, exist_ok=True)

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
        for path in (aside_marker, aside):  # an older set-aside copy of this unit
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
        os.replace(self._marker, aside_marker)
        os.replace(self.root, aside)

    def _drop_aside(self) -> None:
        if not self.store.local:
            return
        aside = self._aside()
        marker = self.store.inside(f"{REPLACED}/{self.rel}{MARKER_SUFFIX}")
        if os.path.exists(marker):
            os.remove(marker)  # marker first: a half-removed copy is never restored
            shutil.rmtree(aside, ignore_errors=True)

    def remove(self, doing: str | None = None) -> None:
        """Remove the unit: its commit marker first, so that a writer killed midway leaves an
        unfinished unit (wiped by the next writer), never a committed one with files missing."""
        self.store.check_held(doing or f"removing {self.rel}")
        fs, marker, root = self.store.fs, self._marker, self.root
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
        if not self.done() and self.store.fs.exists(self.root):
            with contextlib.suppress(OSError):
                self.store.fs.rm(self.root, recursive=True)

    def commit(self, meta: dict, sums: dict | None = None) -> None:
        """Mark the unit complete (the marker is written last and atomically) with its files' checksums
        (``sums``: those already taken elsewhere, e.g. by workers; the rest are taken here)."""
        run = {"run": self.store.run_id} if self.store.run_id else {}
        record = json.loads(
            to_json(
                {
                    **meta,
                    "key": self.key,
                    "kind": self.kind,
                    "committed": time.time(),
                    **run,
                    "version": code_version(),
                    "files": self.checksums(sums),
                }
            )
        )
        self.store.write_text(f"{self.rel}{MARKER_SUFFIX}", to_json({**record, "record": record_digest(record)}))
        self._drop_aside()  # the unit it replaces, set aside by begin()

    def file_sizes(self) -> dict:
        """{path inside the unit: size in bytes} for every regular file of the unit (:meth:`tree`)."""
        return self.tree()[0]

    def tree(self) -> tuple[dict, dict]:
        """({path inside the unit: size} of its regular files, {path: what it is} of anything else in
        it: a symbolic link (never followed), a FIFO, a device). Object stores hold files only."""
        root = self.root
        if not self.store.local:
            found = self.store.fs.find(root, detail=True)
            return {path[len(root) + 1 :]: int(info["size"]) for path, info in sorted(found.items())}, {}
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
                    odd[name] = f"a symbolic link (to {readlink(e.path)})"
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
        return {rel: sums[rel] if rel in sums else size_crc(self.store.fs, f"{self.root}/{rel}") for rel in names}

    def verify(self, sums: dict | None = None, keep=None) -> list[str]:
        """Problems with a committed unit's files: missing, resized or changed since the commit
        (``sums``: checksums already taken of some of them, e.g. by workers; ``keep``: a test on
        the file's name within the unit, to check only those files)."""
        listed = self.meta().get("files")
        try:
            found, odd = self.tree()
        except InputError as e:  # the unit's folder (or its kind's) is a link
            return [str(e).removeprefix(f"{self.store.url}: ")]
        bad = [
            f"{self.rel}/{rel}: {what}; a unit holds regular files only (a store from someone else?)"
            for rel, what in odd.items()
        ]
        if listed is None:  # committed before checksums were recorded: nothing to compare
            return bad
        if not _file_list(listed):
            return bad + [f"{self.rel}{MARKER_SUFFIX}: its list of files is malformed"]
        # a file the commit does not list is damage too: an array added to a model's group is read
        bad += [
            f"{self.rel}/{rel}: not among the files of its commit (added since)" for rel in found if rel not in listed
        ]
        root = self.root
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
        for v in listed.values()
    )


def readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"
