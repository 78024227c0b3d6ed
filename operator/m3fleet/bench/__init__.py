"""`m3fleet bench`: benchmark a running deployment with its engine's own benchmark client.

* `m3fleet.bench.job` (pure): the options, their recipe defaults and checks, and the Kubernetes Job that
  runs the client from the engine image against the resource's Service.
* `m3fleet.bench.results` (pure): the client's JSON results out of the Job's log, one summary per
  concurrency, the seeds' summary table, and the result document kept in a ConfigMap.
* `m3fleet.bench.kube` and `m3fleet.cli.bench`: the thin shell (the current kube context, the command).
"""
