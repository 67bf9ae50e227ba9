"""What-if planning (L4): the cluster's own construction executed on arrays on paper (shapes,
dtypes, shardings; nothing allocated), for our sizes and published architectures on real
topologies, with memory per role and device, whether it fits, and what a sync moves."""
