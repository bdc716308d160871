"""Several nodes: measuring the link between them (``linktest``, with the ``linkprobe`` script that
runs on each node). Starting and stopping RPC workers on other nodes lives in ``moetune.run.remote``."""
