"""Plain-text rendering shared by inspect, analyze and compare: numbers, bytes, tables.

Byte units are decimal (1 MB = 10^6 bytes, 1 GB = 10^9), as disk and GPU vendors state them;
exact byte counts are in the --json output.
"""


def human(n: float, unit: str = "") -> str:
    """124439808 -> '124.4M'; with unit 'B' -> '124.4 MB'"""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {suffix}{unit}" if unit else f"{n / scale:.1f}{suffix}"
    return f"{n:.0f} {unit}" if unit else f"{n:g}"


def count(n: int) -> str:
    """124439808 -> '124,439,808 (124.4M)'"""
    return f"{n:,d} ({human(n)})" if abs(n) >= 1000 else f"{n:,d}"


def nbytes(n: float) -> str:
    return human(n, "B")


def table(rows, headers, align=None) -> str:
    """rows: lists of cells (converted with str); align: string of 'l'/'r' per column"""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    align = align or "l" + "r" * (len(headers) - 1)

    def line(r):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def yes_no(b) -> str:
    return "yes" if b else "no"
