"""What the m3fleet autoscaler would do with a resource: a seeded discrete-event simulation of its fleet.

A distribution of its own (`m3fleet-simulator`, the extra `m3fleet[simulate]`), apart from the operator: the
operator's package and image never import or carry it (an import contract in pyproject.toml says so). It runs
m3fleet's own planner and scaling policy; nothing in m3fleet runs it.

Modules: `scenarios` (seeded request streams), `trace` (a user's request trace, or the demand a resource
recorded in `status.autoscaling.demand`, as a workload), `fleet` (the discrete-event simulation: engines,
replicas, router, scrapes, billing), `coldstart` (time-to-ready from phases and where the weights are),
`calibration` (measured throughput from an `m3fleet bench` result), `whatif` (the policy on a workload, for one
resource) and `command` (`m3fleet simulate`). The comparison with other autoscalers (baselines, oracle, report)
is the project's benchmark, tests/bench/autoscaling, which runs on this package.
"""
