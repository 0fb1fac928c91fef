"""Inference engines: the embedded SGLang-compatible server, the SGLang launcher, and their clients.

Importing this package loads nothing heavy; `launch` and `weights` are what the
trainer, the router tests and the Prefect tasks call.
"""
