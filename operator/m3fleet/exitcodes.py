"""The exit status of every `m3fleet` subcommand, in one place. Scripts, CI steps and Jobs branch on these, so each
code means one thing whichever subcommand returns it (docs/cli.md lists them; a test holds that page to this one).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug in m3fleet: never a traceback unless M3FLEET_DEBUG=1
EXIT_INVALID = 2  # bad input: a file, a flag or a spec (or a spec the planner cannot place); nothing was created
EXIT_BAD_SOURCE = 3  # `stage`: the source or the destination is wrong; the cache Job's podFailurePolicy fails on it
EXIT_UNREACHABLE = 4  # no cluster to talk to: no usable kube context, or the API server does not answer
EXIT_BENCH_FAILED = 5  # `bench`: the benchmark Job ran and failed, or could not run; what finished is kept
EXIT_RETRY = 6  # `stage`: failed in a way a retry may fix (network, a partial or corrupt file)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)

# code -> what it means, for `--help` and the docs
MEANINGS: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_INTERNAL: "internal error (a bug: set M3FLEET_DEBUG=1 for the traceback and report it)",
    EXIT_INVALID: "invalid input: a file, a flag or a spec; one line each names the field, the reason and the fix",
    EXIT_BAD_SOURCE: "stage: the source (revision, repository, access) or the destination (files it did not write) "
    "is wrong; no retry helps",
    EXIT_UNREACHABLE: "cluster unreachable: no usable kube context, or its API server does not answer",
    EXIT_BENCH_FAILED: "bench: the benchmark failed or could not run; finished runs are kept in a ConfigMap",
    EXIT_RETRY: "stage: failed in a way a retry may fix (network, a partial or corrupt file)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
