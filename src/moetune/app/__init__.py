"""The use cases: what each command does, as a function from a typed request to a typed result.

The command line (``moetune.cli``) parses its options into a request, calls one function here and
renders what it returns; the functions here read and write files and the history, call the core
packages (plan, engine, run, bench, tune, report, store) and print nothing (progress goes through
callbacks). Layering: cli -> app -> the core; no core package imports this one, and nothing here
imports click or rich.
"""
