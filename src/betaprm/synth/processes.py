"""The demo's worker processes: how a spawned worker follows its parent."""

from __future__ import annotations

import os
import threading
import time


def exit_with_parent(parent: int) -> None:
    """Process-pool initializer: the worker exits once its parent process is gone. A demo
    stopped with ``kill`` (not Ctrl-C, which reaches the whole process group) would otherwise
    leave its workers training for minutes."""

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()
