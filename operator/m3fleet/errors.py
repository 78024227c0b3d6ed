"""The errors users see: bad input (which field, what is wrong, how to fix it), and a cluster that cannot be reached."""

from __future__ import annotations


class SpecError(ValueError):
    """A spec that cannot work. Never a traceback: the CLI prints it, the operator puts it in status."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}; fix: {self.fix}" if self.fix else f"{self.field}: {self.problem}"


class SpecErrors(ValueError):
    """Several independent problems in one resource (e.g. every schema violation at once)."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


class ClusterUnreachable(Exception):
    """No cluster to talk to: no usable kube context, or its API server gives no answer. The CLI exits with
    `m3fleet.exitcodes.EXIT_UNREACHABLE`, so a pipeline can tell it from bad input."""
