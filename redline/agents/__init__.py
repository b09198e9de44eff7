"""Node agents: the spot-preemption agent."""
