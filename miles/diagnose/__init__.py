"""`miles diagnose RUN_DIR`: why a run is stuck, slow or dead, as a verdict in words and one bundle."""
