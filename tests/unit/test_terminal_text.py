"""A job's log reaches a terminal only through terminal_text: no escape sequence of the job's (window title,
OSC 52 clipboard write, clear screen, cursor moves) and no control character but newline and tab gets through;
written to a file or a pipe the log stays as the job wrote it."""

import io

from verl_cluster.terminal_text import TerminalWriter, for_terminal

TITLE = "\x1b]0;you have been pwned\x07"
TITLE_ST = "\x1b]2;other title\x1b\\"
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNofHNo\x07"  # OSC 52: writes the clipboard
CLEAR = "\x1b[2J\x1b[3J\x1b[H"  # clear screen, scrollback, cursor home
RESET = "\x1bc"  # full terminal reset
DCS = "\x1bP1$qm\x1b\\"
C1_CSI = "\x9b2J"  # the 8-bit CSI


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_every_escape_and_control_is_stripped_for_a_terminal():
    log = (f"step:1 - loss:0.5\n{TITLE}{TITLE_ST}{CLIPBOARD}{CLEAR}{RESET}{DCS}{C1_CSI}"
           "\x1b[36m(TaskRunner pid=1)\x1b[0m line\tend\n"
           "innocent\rforged\x08\x08\x07\x00\x7f\n")
    safe = for_terminal(log)
    assert "\x1b" not in safe and "\x9b" not in safe
    assert not any(ord(c) < 32 and c not in "\n\t" for c in safe), repr(safe)
    assert "pwned" not in safe and "Y3VybCBldmlsLnNofHNo" not in safe and "other title" not in safe
    # what the job meant to print is still there; a carriage return cannot overwrite a line
    assert "step:1 - loss:0.5\n" in safe and "(TaskRunner pid=1) line\tend\n" in safe
    assert "innocent\nforged" in safe


def test_a_sequence_cut_between_two_chunks_is_still_stripped():
    seq = f"before{CLIPBOARD}{CLEAR}after\r\nnext\n"
    for cut in range(1, len(seq)):
        out = Tty()
        w = TerminalWriter(out)
        w.write(seq[:cut])
        w.write(seq[cut:])
        w.close()
        assert out.getvalue() == "beforeafter\nnext\n", (cut, out.getvalue())


def test_a_file_or_pipe_gets_the_log_unchanged():
    out = io.StringIO()  # not a terminal
    w = TerminalWriter(out)
    w.write(f"a{TITLE}b\r")
    w.write("\n")
    assert out.getvalue() == f"a{TITLE}b\r\n"
