"""Position schemes as plug-ins: one module per scheme, one registry.

`build_positions(cfg.positional, cfg, causal)` builds a stack's scheme by name;
`registered()` lists the names. Each module of this package is a scheme that registers
itself in `POSITIONS` (`aiayn.config.plugins.Registry`), found on first use:

    sinusoidal, sinusoidal_halves  the paper's fixed sinusoids (section 3.5), and Marian's layout
    learned                        one learned vector per position (Table 3, row E)
    rotary                         RoPE rotation of queries and keys (Su et al. 2021)
    relative                       T5's bucketed relative-position bias (Raffel et al. 2020)
    alibi                          linear distance penalties (Press et al. 2022)
    none                           no position information
"""

from aiayn.nn.positions.base import (
    POSITIONS,
    PositionScheme,
    build_positions,
    register,
    registered,
)

__all__ = ["POSITIONS", "PositionScheme", "build_positions", "register", "registered"]
