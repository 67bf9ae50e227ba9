"""Test set-up: eight simulated CPU devices, configured before the JAX backend starts."""
from rlcluster_lab.devices import ensure_simulated_devices

ensure_simulated_devices(8)
