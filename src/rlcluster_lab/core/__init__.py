"""The vocabulary everything else speaks: the options (layouts, engines, anchor modes, dtypes,
sizes; JAX-free), roles and modes, the cluster's config, meshes and devices, the decision trace
(L1), errors, and the persistent compilation cache."""
