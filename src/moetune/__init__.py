"""moetune: plan, launch, benchmark and tune huge Mixture-of-Experts models on llama.cpp."""

__version__ = "0.1.0"
