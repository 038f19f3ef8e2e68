"""The one place a job's log output passes through before it reaches a terminal.

A job's log is not trusted: its bytes can carry terminal escapes that set the window title, write the clipboard
(OSC 52), clear the screen or move the cursor to overwrite what was printed before. On a terminal every ESC
sequence (CSI, OSC, DCS/SOS/PM/APC, the two-character ones) is removed, a lone carriage return becomes a newline
(it would overwrite the line), and every other C0/C1 control character but newline and tab becomes U+FFFD.
Written to a file or a pipe, the log stays as the job wrote it.
"""

from __future__ import annotations

import re
from typing import TextIO

_SEQ = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, clear screen (ESC [ 2 J)
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\|$)"  # OSC: title (ESC ] 0 ;), clipboard (ESC ] 52 ;), hyperlinks
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\|$)"  # DCS, SOS, PM, APC, up to their string terminator
    r"|\x1b[ -/]*[0-~]"  # two-character and nF sequences: ESC c (reset), ESC 7, ESC ( B
    r"|\x1b"  # a lone ESC
)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# an escape sequence (or a carriage return) cut by the end of a chunk: held until the next chunk completes it
_OPEN_AT_END = re.compile(r"(?:\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*|[PX^_][^\x1b]*|[ -/]*)|\r)\Z")
HOLD_MAX = 4096  # a sequence left open longer than this is dropped, not held


def for_terminal(text: str) -> str:
    """`text` made safe to print on a terminal (see the module's docstring)."""
    text = _SEQ.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("\ufffd", text)


def is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class TerminalWriter:
    """Writes streamed log text to `stream`, made safe when the stream is a terminal (`force`: always). A
    sequence split across two chunks is held back until the next one completes it."""

    def __init__(self, stream: TextIO, force: bool = False):
        self.stream, self.safe, self.held = stream, force or is_terminal(stream), ""

    def write(self, text: str) -> None:
        if not self.safe:
            self.stream.write(text)
            self.stream.flush()
            return
        text = self.held + text
        self.held = ""
        m = _OPEN_AT_END.search(text)
        if m and len(text) - m.start() <= HOLD_MAX:
            text, self.held = text[:m.start()], text[m.start():]
        if text:
            self.stream.write(for_terminal(text))
            self.stream.flush()

    def close(self) -> None:
        """Writes what was held (an escape left open at the end of the log is dropped by the sanitizer)."""
        if self.held:
            held, self.held = self.held, ""
            self.stream.write(for_terminal(held))
            self.stream.flush()

