"""Progress bars for long work (loading, conversion, calibration, evaluation, benchmarks)."""

from __future__ import annotations

from typing import Any

from tqdm import tqdm


def progress_bar(total: float, desc: str, unit: str = "it", enabled: bool | None = None,
                 **options: Any) -> tqdm:
    """A tqdm bar on stderr, shown on a terminal only (quiet in logs and tests) unless
    `enabled` forces it on or off; a disabled bar still takes update() and `with`."""
    return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True,
                disable=None if enabled is None else not enabled, **options)
