"""Example kernels written once in the portable xsync API."""
