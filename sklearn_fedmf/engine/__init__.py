"""The engine of every fit: the fit skeleton, the round loop, the exchanges (plain or secure),
transports, groups and dispatch."""
