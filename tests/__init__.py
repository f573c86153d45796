"""edgespec's tests in tiers (docs/development.md): unit, engine, real, server, tui; helpers in support."""
