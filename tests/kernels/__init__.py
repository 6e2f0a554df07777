"""The kernels: launch policy per target, compiles without a GPU, the interpreter's fixes and agreement."""
