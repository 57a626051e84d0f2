"""Prometheus metrics of the admin API (`GET /metrics`, docs/METRICS.md).

`http.py` counts and times every HTTP request by method, route template and status;
`registry_gauges.py` reads the job, agent and catalog rows at scrape time; `endpoint.py`
puts both on an app. Like the agents' and routers' `/metrics`, it needs no token: no
sample carries a tenant's identity (namespaces, aliases, digests, tokens); the only
names it shows are route templates and agent names, which the operator chose.
"""
