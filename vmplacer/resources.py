"""Where the files vmplacer reads at run time live: inside the installed package.

`templates/`, `migrations/`, `systemd/` and `docs/` stay at the top of the repository; the build
(setup.py) copies them into the package, so a wheel carries them as `vmplacer/<name>`. A
checkout (or an editable install of one) has them at the top instead.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

SHIPPED = ("templates", "migrations", "systemd", "docs")


def resource_dir(name: str) -> Path:
    """The directory `name` (one of SHIPPED) of this installation."""
    if name not in SHIPPED:
        raise ValueError(f"{name!r} is not a directory vmplacer ships (one of {', '.join(SHIPPED)})")
    packaged = Path(str(files("vmplacer") / name))
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / name
