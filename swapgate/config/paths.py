"""Where swapgate keeps what outlives a process, in one place: ``$SWAPGATE_STATE_DIR`` when
set, else ``$XDG_STATE_HOME/swapgate`` (else ``~/.local/state/swapgate``).

What lies there: the process ledger's records (``processes/`` under the default root, or
``*.json`` in ``$SWAPGATE_STATE_DIR``), the demand by time of day (``demand-by-day.state``), the
activity log of each gateway (``activity-PORT.sqlite3``) and a running demo's admin token
(``demo-admin-token``).
Nothing else is named ``*.json`` there: the ledger sweeps those.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "SWAPGATE_STATE_DIR"


def explicit_directory() -> Path | None:
    """``$SWAPGATE_STATE_DIR``: where everything swapgate keeps goes, when set."""
    explicit = os.environ.get(STATE_DIR_ENV)
    return Path(explicit) if explicit else None


def state_root() -> Path:
    """swapgate's own directory under ``$XDG_STATE_HOME`` (else ``~/.local/state``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "swapgate"


def state_directory() -> Path:
    """Where a file swapgate keeps goes: ``$SWAPGATE_STATE_DIR``, else the state root."""
    return explicit_directory() or state_root()


def processes_directory() -> Path:
    """Where the process ledger records the groups swapgate started."""
    return explicit_directory() or state_root() / "processes"
