"""Golden histories: recorded runs kept as files that today's code must still replay."""
