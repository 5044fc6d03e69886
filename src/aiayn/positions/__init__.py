"""Position schemes as plug-ins: one module per scheme, one registry.

`build_positions(cfg.positional, cfg, causal)` builds a stack's scheme by name;
`registered()` lists the names. Importing this package imports the built-in schemes,
each of which registers itself:

    sinusoidal, sinusoidal_halves  the paper's fixed sinusoids (section 3.5), and Marian's layout
    learned                        one learned vector per position (Table 3, row E)
    rotary                         RoPE rotation of queries and keys (Su et al. 2021)
    relative                       T5's bucketed relative-position bias (Raffel et al. 2020)
    alibi                          linear distance penalties (Press et al. 2022)
    none                           no position information
"""

from aiayn.positions import alibi, learned, none, relative, rotary, sinusoidal  # noqa: F401
from aiayn.positions.base import PositionScheme, build_positions, register, registered

__all__ = ["PositionScheme", "build_positions", "register", "registered"]
