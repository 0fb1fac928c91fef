"""Mixture-of-experts routing: its statistics per layer and iteration, and their capture in the
training passes."""
