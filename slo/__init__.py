"""The versioned spec, its loader and the SLO maths (layer 1: pure)."""
