"""The spot preemption drills: a fleet of real processes, a real notice, real clients."""
