"""The paper's model of a group, pure numpy (no torch.distributed): who holds what (Eq 1, Table 2),
what a step costs in each layout (Eq 4, 10), what a switch moves and costs (Eq 2, 3, 5, 7, 9,
13-14) and which layout to run (Eq 6, 8). The runtime applies its plans; the studies sweep it."""
