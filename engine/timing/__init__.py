"""Step-time models for one forward pass on modeled hardware."""
