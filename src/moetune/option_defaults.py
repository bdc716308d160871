"""The defaults and choices the command line shows in its options' help, kept where the commands
can import them without loading the modules that use them (numpy, rich, the HTTP clients): one
source for both."""

from __future__ import annotations

DEFAULT_MIN_CHANGE = 0.03  # the smallest relative difference a comparison calls a change
RESULT_FORMATS = ("md", "csv", "json")  # `results export` formats
DEFAULT_TURNS = 4  # turns of a session, `tune --objective turn`
DEFAULT_SYSTEM_TOKENS = 512  # its system prompt, without --depth
ARRIVALS = ("poisson", "constant")  # serve-bench's request arrival processes
BUILTIN_WORKLOADS = ("short-json", "long-openapi", "reference")  # reference = both, as the field report runs them
