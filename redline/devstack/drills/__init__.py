"""The drills: inject one real fault into the running local stack and time the whole loop."""
