"""Kernels written once in the portable xsync API, shipped as ``xsync.kernels``.

The repository keeps them in this top-level ``kernels/`` folder; the wheel maps the folder
to ``xsync.kernels`` and a source checkout resolves ``xsync.kernels`` here (see
``xsync/_source_kernels.py``). The top-level name ``kernels`` belongs to Hugging Face's kernel
hub (the PyPI package ``kernels``, which transformers imports); a checkout whose root is on
``sys.path`` exposes this folder under that name too, so importing it as ``kernels`` hands the
name on: to the installed PyPI package when there is one, else to ``xsync.kernels`` itself
(the same module objects, so no kernel or torch op is defined twice).
"""
if __name__ == "kernels":
    from xsync._source_kernels import resolve_top_level_name

    resolve_top_level_name(__file__)
