"""What several test folders share: polls with a deadline, the flag lists of the short runs, the dashboard
served by its own command, in-process routers, the engine helpers. Tests import these; conftest files
only hold fixtures (no test imports a conftest as a library)."""
