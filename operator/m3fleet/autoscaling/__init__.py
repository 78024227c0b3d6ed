"""Context-length-aware autoscaling: engine signals, Prometheus adapters, the pure policy.

Modules: `signals` (typed snapshots), `prometheus` (Prometheus adapters; the only I/O), `promql` (the queries
they run), `policy` (pure decisions), `forecast` (forecast floor and scheduled bounds), `time_to_ready`
(time-to-ready from pods).
Nothing is imported here, so importing the pure policy never pulls in I/O.
The simulator and `m3fleet simulate` are a distribution of their own (simulator/, `m3fleet[simulate]`), and
the comparison with other autoscalers (baselines, oracle, report) lives in tests/bench/autoscaling.

How an operator drives it, per resource and tick:

1. `config = PolicyConfig.from_spec(spec.autoscaling, plan)` (schedule, forecast period and margin
   included).
2. Time-to-ready: whenever a pod is ready and not yet counted, `time_to_ready.record(previous, pods, events,
   group_size)` measures the replicas that became ready (phases schedule / image / start / load from the
   pods' conditions, containerStatuses and the kubelet's Pulled events; each replica once) and the
   operator writes `record.to_status()` to `status.timeToReady` and observes the histograms (see
   controller/time_to_ready_recorder.py). Per tick: `ages, remaining = time_to_ready.starting(pods, record, now,
   config.cold_start_seconds, group_size)`; `fleet = FleetState(now, current_replicas, ready_replicas,
   starting_ages=ages, time_to_ready_seconds=record.p90_seconds, starting_remaining=remaining)` — the p90
   of the last 10 replicas to become ready, None (the spec's coldStartSeconds) until one has.
3. `snapshot = PrometheusAdapter.for_engine(engine, url, selector=..., gateway=...).read(now)` (`gateway`:
   `promql.Gateway(spec.autoscaling.gateway.request_sizes_metric, match_labels)` when the spec names one,
   so the snapshot carries what it recorded as requests arrived); for the forecast,
   `snapshot = dataclasses.replace(snapshot, demand_history=record.history(now,
   config.forecast_period_seconds, config.forecast_look_ahead(fleet.time_to_ready_seconds)))` where
   `record` is the resource's `forecast.DemandRecord` (read with `DemandRecord.from_status` from
   `status.autoscaling.demand`), and after the decision `record = forecast.record_demand(record, now,
   decision.terms.get("demandReplicas"), period, look_ahead)`, written back with `to_status()` when
   `record.worth_saving(...)` says so.
4. `decision, state = decide(config, state, snapshot, fleet)`; persist `state.to_dict()`; write
   `decision.to_status()` to `status.autoscaling`; emit a Warning Event for each new entry of
   `decision.warnings` (e.g. `KVCapacityMismatch`); apply `decision.desired_replicas` in act mode.
   The learned prefill throughput lives in the state (`prefillRate`, `prefillSamples`) and shows in
   `status.autoscaling.prefillThroughput`, as does a gateway's measured bytes per prompt token
   (`bytesPerToken`, under `gateway`).
"""
