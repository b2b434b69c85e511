# Test environment only: see _custom_ops.py.
