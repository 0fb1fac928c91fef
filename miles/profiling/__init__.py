"""Profiling that writes files: torch profiler windows on the training ranks (`rank`), driven by the
trainer (`driver`), engine traces (`engine`), py-spy dumps (`pyspy`) and the Ray timeline (`ray_timeline`)."""
