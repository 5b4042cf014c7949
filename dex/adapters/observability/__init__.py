"""Optional back ends for the engine's telemetry hooks (install the matching extra)."""
