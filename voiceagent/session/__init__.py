"""A live session: the runner that executes the protocol core's actions with real turns,
and the port every transport implements."""
