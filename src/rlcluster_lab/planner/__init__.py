"""What-if planning (L4): the cluster's own construction executed on arrays on paper (shapes,
dtypes, shardings; nothing allocated), for our sizes and published architectures on real
topologies, with memory per role, device and host through a step's phases (parameters,
gradients, optimizer state, activations, the KV cache, host RAM, the sync's peak), whether
it fits and why not, and what a sync moves within and across hosts."""
