"""The sharding planner: topology -> enumerate -> estimate -> partition -> ShardingPlan."""
