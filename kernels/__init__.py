"""Kernels written once in the portable xsync API, shipped as ``xsync.kernels``.

The repository keeps them in this top-level ``kernels/`` folder; the wheel maps the folder
to ``xsync.kernels`` and a source checkout resolves ``xsync.kernels`` here (see
``xsync/_source_kernels.py``). Importing the folder as a top-level ``kernels`` package
would create a second copy of every kernel and torch op, so it is refused.
"""
if __name__ == "kernels":
    raise ImportError("the xsync kernels are imported as `xsync.kernels` "
                      "(e.g. `from xsync.kernels.flash_attn import attention`), not as `kernels`")
