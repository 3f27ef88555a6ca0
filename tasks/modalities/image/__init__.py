"""The image modality: how image files are read, checked, split into shards, baselined, exported, served and watched.

Each part lives in its own module; importing the package imports none of them (the service imports only what it
serves with)."""
