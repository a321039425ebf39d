"""Child processes that never outlive the autoparallel process that started them.

A parent killed with SIGKILL runs no cleanup, so its children must notice on their own: on Linux
the kernel sends them SIGKILL when the parent dies (``prctl(PR_SET_PDEATHSIG)``); elsewhere a
daemon thread in the child polls for the parent and exits when it is gone. Call ``die_with_parent``
first thing in the child, with the parent's pid read before the fork/spawn.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    if not (sys.platform.startswith("linux") and _pdeathsig()):
        threading.Thread(target=_watch, args=(parent_pid,), daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the guard was in place
        os._exit(1)


def _pdeathsig() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)
