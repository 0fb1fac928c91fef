"""Rollout: the data source, sampling through the router, rewards and advantages."""
