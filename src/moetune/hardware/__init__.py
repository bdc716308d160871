"""Hardware: devices, memory and bandwidths, probed from this machine or declared in a YAML file."""

DEFAULT_RPC_PORT = 50052  # ggml-rpc-server's own default

# The speed model's constants a hardware file may carry for its CPU (``cpu.speed``), measured there
# by `moetune hw attention`: the engine's attention kernels, decoding and prefilling
# (moetune.plan.speed.SpeedConstants; tests/plan check they are its fields)
CPU_SPEED_KEYS = (
    "cpu_ctx_gflops_per_core",
    "cpu_noflash_ctx_factor",
    "cpu_noflash_layer_us",
    "cpu_ctx_quant_factor",
    "cpu_ctx_quant_layer_us",
    "cpu_pp_ctx_gflops_per_core",
    "cpu_pp_noflash_ctx_factor",
    "cpu_pp_ctx_quant_factor",
)
