"""One module per verb: the sections (and headlines) of its report, read from its typed
results."""
