"""Stand-in programs on PATH for running rendered launcher scripts under a real bash (the engines, mpirun, ssh
and the file tools they call are replaced by a script that records how it was called)."""

from __future__ import annotations

from pathlib import Path


def install_stubs(directory: Path, names: tuple[str, ...], script: str) -> Path:
    """Write `script` as each of `names` into `directory` (created), executable; the directory, for PATH."""
    directory.mkdir()
    for name in names:
        (directory / name).write_text(script)
        (directory / name).chmod(0o755)
    return directory
