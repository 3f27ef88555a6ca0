"""The project folder torchship runs in: its one-writer lock (`lock`), its local state (`local_state`: what
`torchship clean` removes), its generated docs (`config_docs`), the UIs of its servers (`ui`) and the automation
`torchship deploy` installs for its crashed runs (`crash_watch`)."""
