"""The endurance harness's app (``benchmarks/soak.py``): three queues and the effect table."""
