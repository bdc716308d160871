"""What the machine did while moetune measured: sampled about once a second during launches and
runs, stored beside each run, exported to Prometheus and drawn in the HTML report.

    snapshot.py   the sample's shape (host, engine processes, GPUs, llama-server's /metrics, load)
    gpu.py        NVML through nvidia-ml-py, when present
    sampler.py    the background sampler: probes -> snapshot -> history, at 1 Hz
    exposition.py snapshots -> the Prometheus text format (pure), and llama-server's /metrics parsed
    serve.py      `moetune metrics serve`: /metrics over HTTP on loopback, from composable sources
    grafana/      the Grafana dashboard over exposition.py's names (`moetune metrics dashboard`)

/proc is read through ``moetune.procfs``, shared with the launcher's liveness checks. A run's
sampler also counts every process's CPU time (``moetune.contention``): the engine's, moetune's own
and the foreign load that flags a run contended.
"""
