"""GPU activity: the check that flags unexplained bursts and hangs, and the host read models."""
