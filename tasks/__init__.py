"""torchship stages: one module per stage, each a pure core plus thin I/O edges."""
