"""One run per run dir at a time: the run dir's lock (``RUN_DIR/.fusebench.lock``), held for the run's life.

It is the mechanism the stores lock their entries with (``stores.entries.entry_lock``: filelock's ``FileLock``, an
OS advisory lock, ``fcntl.flock``), taken without waiting: a second run into a dir whose lock another process holds
is refused (:class:`RunDirInUse`, one line naming the holder: its pid, host, start time and command, which the
holder writes into the lock file when it takes the lock). The kernel releases the lock when its process ends,
however it ends (a SIGKILL, a crash, a lost session), so a killed run never leaves a lock behind: the file stays (a
few hundred bytes naming the last run that held it, read only while someone holds it) and the next run takes it.
A run dir whose lock is free holds no live run, so only then can what a run left in it (an engine database:
``backends.engine_dirs``) be a killed run's leftovers (:func:`check_free`).

Who takes it: the ``fusebench`` command for its run dir (in the Hydra callback, before Hydra rewrites ``.hydra/``)
and for a sweep's dir (before any job starts), each sweep job for its job dir (the sweeper checks every job dir is
free before the first job runs; in a multi-task job, its task 0 for all its tasks: :func:`task_share`), the
Python API for its ``out_dir``, and ``fusebench-report`` for a run dir it
writes a report into; the command releases every lock it took when it ends (``release_all``), a sweep job, the API
and the report when theirs end. Within one process the lock is taken once (a second ``hold`` is a no-op): it keeps
other processes out, not threads of the same one.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from fusebench import FusebenchError

LOCK_NAME = ".fusebench.lock"  # in a run (or sweep) dir
LOCK_FORMAT = "fusebench run dir lock"
HEAD = json.dumps({"format": LOCK_FORMAT})[:-1].encode("utf-8")  # how every holder record begins (_holder_bytes)
NO_LOCKS = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP}  # a filesystem without flock (some network mounts)
_HELD: dict[str, object] = {}  # resolved run dir -> the FileLock this process holds on it
VIEWS_COMMAND = "fusebench-views"  # how the views process (app.views: a run's plots and W&B log) names itself
_PENDING: dict[str, int] = {}  # lock file -> the live views process its last holder handed the dir to
VIEWS_WAIT_S = 600.0  # how long a run waits for a views process drawing in its dir (a run never waits for a run)


class RunDirInUse(FusebenchError):
    """A run dir another live process holds the lock of (a run in it now)."""


def task_share() -> tuple[int, int]:
    """(this task's rank, the job's tasks) in a multi-task submitit job (``hydra.launcher.tasks_per_node`` x
    ``nodes``), else (0, 1). The tasks of one job share its dir by design (``fusebench-embed`` deals the shards among
    them): task 0 holds the dir's lock for all of them."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return 0, 1
    import submitit

    env = submitit.JobEnvironment()
    return int(env.global_rank), int(env.num_tasks)


def _key(run_dir: str | Path) -> str:
    return os.path.realpath(os.path.abspath(os.fspath(run_dir)))


def _holder_bytes(**extra) -> bytes:
    """What the holder writes into the lock file: who it is, for a refused run's message (and ``extra``: the views
    process it handed the dir to)."""
    return (json.dumps({"format": LOCK_FORMAT, "pid": os.getpid(), "host": socket.gethostname(),
                        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
                        "command": " ".join([Path(sys.argv[0]).name if sys.argv else "python", *sys.argv[1:]]),
                        **extra})
            + "\n").encode("utf-8")


def _write_record(fd: int, data: bytes) -> None:
    """The lock file's record replaced by ``data`` (the lock's own fd, or one opened on it by its holder)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _pending_views(data: bytes) -> int | None:
    """The pid of the views process a finished run handed its dir to (``hand_to_views``), when that process is
    alive on this host and is not this one; else None."""
    try:
        info = json.loads(data.decode("utf-8"))
        pid = int(info["views_pending"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if info.get("host") != socket.gethostname() or pid == os.getpid():
        return None  # another host's pid cannot be checked; our own mark is ours to take
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return None if _zombie(pid) else pid


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has ended and waits for its parent to collect it (Linux's /proc; elsewhere: not known)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].startswith("Z")


def _on_acquired(path: str, write: bool):
    """filelock's ``on_acquired`` for ``path``: the previous record read first; a dir handed to a live views
    process is noted (``_PENDING``) and its record left as it is; otherwise the lock is ours, and so is the file's
    content (``write``: the previous holder's replaced by ours)."""

    def acquired(fd: int) -> None:
        pending = _pending_views(os.pread(fd, 4096, 0))
        if pending is not None:
            _PENDING[path] = pending
            return
        if write:
            _write_record(fd, _holder_bytes())

    return acquired


def hand_to_views(run_dir: str | Path, pid: int) -> None:
    """A finished run that holds ``run_dir``'s lock hands the dir to the views process ``pid`` (which will take the
    lock to draw the run's plots): its record says so, so that a run taking the lock before that process does
    waits for it (``hold``) instead of going first."""
    if not held_here(run_dir):
        return
    fd = os.open(Path(run_dir) / LOCK_NAME, os.O_WRONLY)
    try:
        _write_record(fd, _holder_bytes(views_pending=pid))
    finally:
        os.close(fd)


def holder(run_dir: str | Path) -> dict | None:
    """Who last took ``run_dir``'s lock (pid, host, started, command), or None when its file says nothing
    fusebench wrote (absent, empty: a holder that has just taken it and not yet written)."""
    try:
        data = json.loads((Path(run_dir) / LOCK_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == LOCK_FORMAT else None


def describe(info: dict | None) -> str:
    """The holder named in one phrase: 'pid 4242 on host gpu1, started 2026-12-06 03:20:11 UTC: fusebench ...'."""
    if info is None:
        return "a run that has just started (it has not written its pid yet)"
    command = str(info.get("command") or "").strip()
    command = command if len(command) <= 120 else command[:117] + "..."
    return (f"pid {info.get('pid')} on host {info.get('host')}, started {info.get('started')}"
            + (f": {command}" if command else ""))


def in_use_message(run_dir: str | Path, key: str, what: str | None = None) -> str:
    """The one line refusing ``run_dir`` (``what`` it is: by ``key``, a run dir or a sweep dir) to a second run."""
    what = what or ("sweep dir" if key == "hydra.sweep.dir" else "run dir")
    return (f"the {what} {run_dir} is in use by another fusebench "
            f"run ({describe(holder(run_dir))}), which holds its lock {LOCK_NAME} while it runs; wait for it to "
            f"end (a killed run holds nothing: its lock ends with its process), or choose another {key}=...")


def _lock_path(run_dir: str | Path, key: str) -> Path:
    """The lock file of ``run_dir``, refused when something that is not a file (a folder, a link) has its name."""
    path = Path(run_dir) / LOCK_NAME
    if os.path.lexists(path) and (path.is_symlink() or not path.is_file()):
        raise FusebenchError(f"{path} is not a file (fusebench keeps the run dir's lock there, and never removes what "
                             f"it did not write): move it away, or choose another {key}=...")
    if not _ours(path):
        raise FusebenchError(f"{path} is not a lock file fusebench wrote (fusebench keeps the run dir's lock there, "
                             f"and never overwrites what it did not write): move it away, or choose another {key}=...")
    return path



def _ours(path: Path) -> bool:
    """Whether the lock file at ``path`` is absent or fusebench's: empty (just created), or a holder record, whole
    or being written (it begins as :data:`HEAD` does)."""
    try:
        with open(path, "rb") as f:
            start = f.read(len(HEAD))
    except OSError:
        return True  # absent, or unreadable: taking the lock reports it
    return HEAD.startswith(start) or start.startswith(HEAD)


def held_here(run_dir: str | Path) -> bool:
    """Whether this process holds ``run_dir``'s lock."""
    return _key(run_dir) in _HELD


def drawing_views(run_dir: str | Path) -> bool:
    """Whether ``run_dir``'s lock was last taken by a views process (a finished run's plots and log being made)."""
    return str((holder(run_dir) or {}).get("command") or "").startswith(VIEWS_COMMAND)


def _views_holding(run_dir: str | Path) -> int | None:
    """The pid of the views process that holds ``run_dir``'s lock, or is about to: its record names it, or still
    names the run that handed it the dir (``views_pending``: taken an instant ago, or the run not yet gone); None
    when a run holds it. A record being rewritten (empty for an instant) is read again."""
    for _ in range(5):
        try:
            data = (Path(run_dir) / LOCK_NAME).read_bytes()
        except OSError:
            data = b""
        if data.strip():
            return (holder(run_dir) or {}).get("pid") if drawing_views(run_dir) else _pending_views(data)
        time.sleep(0.01)
    return None


def _acquire(lock, run_dir: str | Path, key: str, what: str | None, wait: float) -> None:
    """Take ``lock`` without waiting, or within ``wait`` seconds. A views process drawing an earlier run's plots
    there, or one that run handed the dir to (``hand_to_views``), is waited for, up to :data:`VIEWS_WAIT_S` (it
    ends within seconds), in short steps that look again each time; a run holding it is :class:`RunDirInUse`."""
    from filelock import Timeout

    path, deadline = str(Path(run_dir) / LOCK_NAME), None
    while True:
        try:
            lock.acquire(timeout=wait) if wait > 0 else lock.acquire(blocking=False)
        except Timeout:
            pid = _views_holding(run_dir)
            if pid is None:
                raise RunDirInUse(in_use_message(run_dir, key, what)) from None
        else:
            pid = _PENDING.pop(path, None)
            if pid is None:
                return
            lock.release(force=True)  # handed to a views process that has not taken it yet: its turn first
        if deadline is None:
            deadline = time.monotonic() + VIEWS_WAIT_S
            print(f"fusebench: waiting for the plots of the earlier run in {run_dir} (pid {pid} draws them)",
                  file=sys.stderr, flush=True)
        if time.monotonic() > deadline:
            raise RunDirInUse(in_use_message(run_dir, key, what))
        time.sleep(0.1)


def hold(run_dir: str | Path, key: str = "hydra.run.dir", what: str | None = None, wait: float = 0.0) -> bool:
    """Take ``run_dir``'s lock (the dir must exist) for this run's life, without waiting (``wait``: up to that many
    seconds) save for a views process drawing a finished run's plots there: another process holding it is
    :class:`RunDirInUse`, naming it and ``key`` (``what``: what the dir is, for the message). Returns False
    when this process held it already (nothing taken: the one who took it releases it), True when taken here."""
    from filelock import FileLock

    if held_here(run_dir):
        return False
    path = _lock_path(run_dir, key)
    lock = FileLock(str(path), thread_local=False, on_acquired=_on_acquired(str(path), write=True))
    try:
        _acquire(lock, run_dir, key, what, wait)
    except OSError as err:
        if err.errno not in NO_LOCKS:
            raise
        raise FusebenchError(f"cannot lock {path} ({err.strerror}): its filesystem offers no file locks (flock), "
                             "which fusebench needs to keep two runs out of one dir; choose a folder on another "
                             f"filesystem (a local disk) with {key}=...") from None
    _HELD[_key(run_dir)] = lock
    return True


def release(run_dir: str | Path) -> None:
    """Release ``run_dir``'s lock when this process holds it (its file stays: see the module's doc)."""
    lock = _HELD.pop(_key(run_dir), None)
    if lock is not None:
        lock.release(force=True)


def release_all() -> None:
    """Release every run dir lock this process holds (the command ends)."""
    for run_dir in list(_HELD):
        release(run_dir)


def check_free(run_dir: str | Path, key: str = "hydra.run.dir", what: str | None = None) -> None:
    """Refuse (:class:`RunDirInUse`) when another process holds ``run_dir``'s lock: what is in the dir may be a live
    run's. Held by this process, or free (no process holds it: no live run there), passes; a probe only, which
    neither keeps the lock nor rewrites who holds it."""
    from filelock import FileLock

    path = Path(run_dir) / LOCK_NAME
    if held_here(run_dir) or not path.is_file() or path.is_symlink():
        return
    probe = FileLock(str(path), thread_local=False, on_acquired=_on_acquired(str(path), write=False))
    _acquire(probe, run_dir, key, what, 0.0)
    probe.release(force=True)
