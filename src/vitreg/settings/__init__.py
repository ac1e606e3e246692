"""The config parts as plain typed data, low in the house: each verb's config
(:mod:`vitreg.configs`) composes them, and the library code that reads a part takes it whole
(``find_neurons(model, images, search)``), so a setting has one shape from the command line to
the code that uses it."""
