"""DOP's activation exchange (paper §3, Eq 4): the bytes each rank receives when query rows
go to their owners for all heads and outputs come back for each rank's head share."""

from __future__ import annotations

import numpy as np


def dop_exchange_bytes(own_rows, heads: int, width_to_owner: int, width_from_owner: int,
                       elem_bytes: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each rank receives in DOP's two exchanges of one layer (Eq 4 per rank).

    Owner r receives its N_r rows for the (1 − 1/T)·H heads other ranks computed, then every
    rank receives its H/T heads of the N − N_r rows owned elsewhere. Summed over ranks this is
    Eq 4: V_DOP = (1 − 1/T)·N·H·(d_q + d_z)·b."""
    own = np.asarray(own_rows, dtype=np.float64)
    n = own.sum()
    to_owner = own * heads * (1.0 - 1.0 / T) * width_to_owner * elem_bytes
    from_owner = (n - own) * (heads / T) * width_from_owner * elem_bytes
    return to_owner, from_owner


def eq4_volume(rows: int, heads: int, d_q: int, d_z: int, elem_bytes: int, T: int) -> float:
    """Eq 4 as printed: aggregate bytes received by DOP's two exchanges of one layer."""
    return (1.0 - 1.0 / T) * rows * heads * (d_q + d_z) * elem_bytes
