"""`miles dashboard RUN_DIR`: a read-only web view of a run directory (signals, timeline, samples, tokens)."""
