"""Training: the one loop, losses, optimiser and schedules, distributed wrapping, telemetry."""
