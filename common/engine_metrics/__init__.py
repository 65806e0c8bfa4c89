"""Reading inference engines: one implementation for every process that observes them.

  names     each runtime's metric names and where its /metrics page is
  scrape    the HTTP/1.1 GET of a page or a /health (the shared keep-alive client, a semaphore)
  parse     a page -> EngineSample, two samples -> the ReplicaObservation routing reads
  hold      the queue hold over the last scrapes
  material  whether a new observation must replace the stored one
  observer  the per-engine memory (previous sample, kept lines, held queue) tying them together
  reported  which replicas an agent observes for fabricd (its heartbeat's observed_replicas)

The agent runs the observer for the engines on its own host and reports what changed materially
(agent.engine_watch); fabricd's routing controller runs it only for the replicas no agent
reports (the lab without agents, dry-run, replicas an upgraded agent does not know, tests).
"""
