"""The local stack (`redline up`/`down`/`status`) and its end-to-end drills (`redline drill`)."""
