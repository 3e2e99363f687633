"""What both model backends train with: the PPO update loop, micro-batching, packing, shared
prefixes, the optimizer and schedule, and the value-model mixin of the critics."""
