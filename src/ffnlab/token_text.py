"""One token shown on its own: in a table cell, an axis label, a page. The same rendering everywhere.

    ' Paris'  -> '␣Paris'      a space is a visible mark: a space token is never an empty cell
    '\\n'      -> '↵'           newline, tab -> '⇥'; other control characters as <0x07>,
                              private-use and unassigned code points (no font draws them) as <U+E000>
    '":"'     -> '":"'         the text itself, never repr() (which doubles every backslash)
    'æľ' (half of a UTF-8 character) -> '<0xE6><0x9C>'   the bytes, not a U+FFFD box
    a token longer than the cell -> cut with '…'

Widths count display columns (a CJK character takes two), so text tables stay aligned.
"""
import functools
import unicodedata

from .formats.tokenizer import bytes_to_unicode

MARKS = {" ": "\u2423", "\n": "\u21b5", "\t": "\u21e5", "\r": ""}     # ␣ ↵ ⇥
ELLIPSIS = "\u2026"


def visible(text):
    """Whitespace as marks and control characters as <0xNN>, so nothing in a token is invisible."""
    out = []
    for c in text:
        if c in MARKS:
            out.append(MARKS[c])
        elif unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(f"<0x{ord(c):02X}>")
        elif unicodedata.category(c) in ("Co", "Cn", "Cs"):             # private use, unassigned: no font has it
            out.append(f"<U+{ord(c):04X}>")
        else:
            out.append(c)
    return "".join(out) or "\u2205"                                     # ∅: a token that decodes to nothing


def columns(s):
    """Display columns of s in a terminal: wide (CJK) characters take two, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def fit(s, width, align=">"):
    """s cut to `width` display columns (the last one an ellipsis when cut), padded to exactly width."""
    if columns(s) > width:
        while columns(s) > width - 1:
            s = s[:-1]
        s += ELLIPSIS
    pad = " " * (width - columns(s))
    return pad + s if align == ">" else s + pad


@functools.lru_cache(maxsize=1)
def _byte_of_char():
    """GPT-2's byte-level BPE alphabet, inverted: the character a piece shows -> the byte it stands for."""
    return {c: b for b, c in bytes_to_unicode().items()}


def token_label(tokenizer, i):
    """Token id i as a label: its decoded text made visible; a token that is only part of a UTF-8
    character (its decoding holds U+FFFD) shows its bytes instead."""
    text = tokenizer.decode([int(i)])
    if "\ufffd" not in text:
        return visible(text)
    piece = tokenizer.token_text(int(i))
    if piece.startswith("<0x") and piece.endswith(">"):                 # SentencePiece byte token: <0xE6>
        return piece
    table = _byte_of_char()                                             # byte-level BPE: 'æľ' -> e6 9c
    if piece and all(c in table for c in piece):
        return "".join(f"<0x{table[c]:02X}>" for c in piece)
    return visible(text)
