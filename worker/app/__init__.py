"""The composition root and what every process shares: settings, clock, logs, metrics."""
