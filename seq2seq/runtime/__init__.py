"""The process every command runs in: how it starts (`process`), how SIGINT/SIGTERM end it
(`signals`), glibc's handling of freed host memory (`allocator`), where it computes: the
processes of a multi-host run, the device mesh and its shardings (`distributed`), and JAX's
compilation: the persistent cache (`persistent_cache`) and programs compiled ahead, in parallel
(`compiling`).

May import: shared.
"""
