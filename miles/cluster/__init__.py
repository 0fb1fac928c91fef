"""The run's Ray side without Prefect: connecting to Ray, naming the run's actors, the service actors, chunks."""
