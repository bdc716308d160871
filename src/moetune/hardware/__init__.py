"""Hardware: devices, memory and bandwidths, probed from this machine or declared in a YAML file."""

DEFAULT_RPC_PORT = 50052  # ggml-rpc-server's own default
