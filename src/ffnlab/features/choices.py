"""The choices the command line offers before anything heavy loads (the parser reads them without NumPy or numba)."""

# what replaces the site for CE_ablated (evaluate.py says what each does)
ABLATIONS = ("zero", "zero-after-first", "mean")
