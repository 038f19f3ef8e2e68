"""The small part of bash that verl's example scripts use, read without running anything.

Understood: comments, `\\` continuations, quotes, `VAR=value`, `export`, `unset`, `set -x`-style options,
`$VAR`, `${VAR}`, `${VAR:-default}` (and `-`, `:=`, `:?`, `:+`), `$((arithmetic))`, `$(pwd)`, `$(date +FMT)`,
`"$@"` and one `python -m MODULE ...` command. Everything else (if/for/while, functions, pipes, redirections,
arrays, other commands) raises ConfigError naming file:line and what to do: a guess would run the wrong job.
A variable the script neither sets nor defaults comes from this shell's environment, as bash would take it.
"""

from __future__ import annotations

import ast
import operator
import os
import re
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

from verl_cluster.config.names import is_secret_name
from verl_cluster.errors import ConfigError
from verl_cluster.verl_scripts.shell_secrets import SecretTracking

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
PYTHON = re.compile(r"(.*/)?python[0-9.]*")
ARGS = "\0args"  # where "$@" stood: the command line's key=value go there
SHELL_LOGIC = ("if", "then", "elif", "else", "fi", "for", "while", "until", "do", "done", "case", "esac",
               "function", "select", "[", "[[", "test", "{", "}", "!")
REDUCE = ("reduce the script to variable settings, exports and one `python3 -m verl...` line (or write the job "
          "spec by hand: see launch/gsm8k.yaml)")
OPERATOR_HELP = {
    "|": ("a pipe (`|`)", "Ray keeps the job's output (`verl-cluster logs ID`): remove `| tee ...`"),
    "&": ("`&`/`&&` (background jobs or command lists)", "one command per line; run other steps before submitting"),
    ">": ("a redirection", "Ray keeps the job's output (`verl-cluster logs ID`): remove `> file` / `2>&1`"),
    "<": ("a redirection", "remove it"),
    "(": ("a subshell (`(...)`)", REDUCE),
    ")": ("a subshell (`(...)`)", REDUCE),
}


def looks_secret(name: str) -> bool:
    """WANDB_API_KEY, HF_TOKEN, *_SECRET, *_PASSWORD: values never printed or written (the one rule, in names.py)."""
    return is_secret_name(name)


@dataclass
class Part:
    kind: str  # lit | var | arith | cmd | args
    text: str  # literal text, variable name, expression or command
    quoted: bool
    op: str = ""  # var only: "", ":-", "-", ":=", "=", ":?", "?", ":+", "+"
    default: list["Part"] = field(default_factory=list)


@dataclass
class Word:
    parts: list[Part]
    line: int


@dataclass
class Command:
    words: list[Word]
    line: int


class Lexer:
    """Source text -> commands of words (quotes kept as part flags; nothing expanded yet)."""

    def __init__(self, text: str, src: str):
        self.s, self.i, self.line, self.src = text, 0, 1, src

    def fail(self, msg: str, hint: Optional[str] = None, line: Optional[int] = None):
        raise ConfigError(f"{self.src}:{line or self.line}: {msg}", hint)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def commands(self) -> list[Command]:
        out, words, start = [], [], 0
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c == "#":  # between words: a comment
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            elif c in "\n;":
                if words:
                    out.append(Command(words, start))
                    words = []
                self.line += c == "\n"
                self.i += 1
            elif c in OPERATOR_HELP:
                what, hint = OPERATOR_HELP[c]
                if c == "(" and words and words[-1].parts and words[-1].parts[-1].text.endswith("="):
                    what, hint = "a bash array (`NAME=(...)`)", "write the values out on the python line"
                elif c == "(" and words and self.peek(1) == ")":
                    what = "a shell function definition"
                self.fail(f"{what} is not understood", hint)
            else:
                if not words:
                    start = self.line
                words.append(Word(self.word(), self.line))
        if words:
            out.append(Command(words, start))
        return out

    def _lit(self, parts: list[Part], text: str, quoted: bool) -> None:
        if parts and parts[-1].kind == "lit" and parts[-1].quoted == quoted:
            parts[-1].text += text
        else:
            parts.append(Part("lit", text, quoted))

    def word(self, stop: str = " \t\r\n;|&<>()") -> list[Part]:
        parts: list[Part] = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in stop:
                break
            if c == "\\":
                nxt = self.peek(1)
                self.i += 2
                if nxt == "\n":
                    self.line += 1
                elif nxt:
                    self._lit(parts, nxt, True)
            elif c == "'":
                self._lit(parts, self.single(), True)
            elif c == '"':
                self.double(parts)
            elif c == "$":
                self.dollar(parts, quoted=False)
            elif c == "`":
                parts.append(Part("cmd", self.backtick(), False))
            else:
                self._lit(parts, c, False)
                self.i += 1
        return parts

    def single(self) -> str:
        start, self.i = self.line, self.i + 1
        j = self.s.find("'", self.i)
        if j < 0:
            self.fail("unterminated single quote", "close it with '", start)
        text = self.s[self.i:j]
        self.line += text.count("\n")
        self.i = j + 1
        return text

    def double(self, parts: list[Part]) -> None:
        start, self.i = self.line, self.i + 1
        self._lit(parts, "", True)  # "" is an (empty) word of its own
        while True:
            c = self.peek()
            if not c:
                self.fail('unterminated double quote', 'close it with "', start)
            if c == '"':
                self.i += 1
                return
            if c == "\\" and self.peek(1) in '$`"\\\n':
                nxt = self.peek(1)
                self.i += 2
                if nxt == "\n":
                    self.line += 1
                else:
                    self._lit(parts, nxt, True)
            elif c == "$":
                self.dollar(parts, quoted=True)
            elif c == "`":
                parts.append(Part("cmd", self.backtick(), True))
            else:
                self.line += c == "\n"
                self._lit(parts, c, True)
                self.i += 1

    def backtick(self) -> str:
        j = self.s.find("`", self.i + 1)
        if j < 0:
            self.fail("unterminated backquote")
        text, self.i = self.s[self.i + 1:j], j + 1
        return text

    def _until_close(self, open_: str, close: str) -> str:
        """Text up to the matching `close` (nesting on `open_`, quotes skipped); the cursor ends after it."""
        depth, j, start = 0, self.i, self.line
        while j < len(self.s):
            c = self.s[j]
            if c in "'\"":
                k = self.s.find(c, j + 1)
                j = k if k >= 0 else len(self.s)
            elif c == open_:
                depth += 1
            elif c == close:
                if depth == 0:
                    text = self.s[self.i:j]
                    self.line += text.count("\n")
                    self.i = j + 1
                    return text
                depth -= 1
            j += 1
        self.fail(f"no closing `{close}`", None, start)
        return ""

    def dollar(self, parts: list[Part], quoted: bool) -> None:
        nxt = self.peek(1)
        if self.s.startswith("$((", self.i):
            self.i += 3
            expr = self._until_close("(", ")")
            if self.peek() != ")":
                self.fail("`$((` without `))`")
            self.i += 1
            parts.append(Part("arith", expr, quoted))
        elif nxt == "(":
            self.i += 2
            parts.append(Part("cmd", self._until_close("(", ")"), quoted))
        elif nxt == "{":
            self.i += 2
            parts.append(self.braced(quoted))
        elif nxt in "@*":
            self.i += 2
            parts.append(Part("args", "", quoted))
        elif nxt.isdigit():
            self.i += 2
            parts.append(Part("var", nxt, quoted))
        elif nxt and (nxt.isalpha() or nxt == "_"):
            m = NAME.match(self.s, self.i + 1)
            self.i = m.end()
            parts.append(Part("var", m.group(0), quoted))
        elif nxt in ("#", "?", "$", "!", "-", "'"):
            self.fail(f"`${nxt}` is not understood", REDUCE)
        else:
            self._lit(parts, "$", quoted)
            self.i += 1

    def braced(self, quoted: bool) -> Part:
        m = NAME.match(self.s, self.i) or re.compile(r"[0-9]+|[@*]").match(self.s, self.i)
        if not m:
            self.fail(f"`${{{self.s[self.i:self.i + 12]}...` is not understood", REDUCE)
        name, self.i = m.group(0), m.end()
        if name in "@*":
            if self.peek() != "}":
                self.fail("`${@...}` is not understood", REDUCE)
            self.i += 1
            return Part("args", "", quoted)
        if self.peek() == "}":
            self.i += 1
            return Part("var", name, quoted)
        op = next((o for o in (":-", ":=", ":?", ":+", "-", "=", "?", "+") if self.s.startswith(o, self.i)), None)
        if op is None:
            self.fail(f"`${{{name}{self.s[self.i:self.i + 8]}...`: only ${{VAR}}, ${{VAR:-default}}, ${{VAR-default}}, "
                      "${VAR:=default}, ${VAR:?message} and ${VAR:+value} are understood", REDUCE)
        self.i += len(op)
        default = self.word(stop="}")
        if self.peek() != "}":
            self.fail(f"`${{{name}{op}...` has no closing `}}`")
        self.i += 1
        if quoted:
            for p in default:
                p.quoted = True
        return Part("var", name, quoted, op, default)


_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: operator.mod,
              ast.Pow: operator.pow}


INT64 = 1 << 63  # bash arithmetic is 64-bit: a value outside it is refused, not computed (9**9**9 never ends)
MAX_ARITH_CHARS = 200


def _arith(node: ast.AST, value_of) -> int:
    v = _arith_node(node, value_of)
    if not -INT64 <= v < INT64:
        raise ValueError("out of 64-bit range")
    return v


def _arith_node(node: ast.AST, value_of) -> int:
    if isinstance(node, ast.Expression):
        return _arith(node.body, value_of)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return value_of(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _arith(node.operand, value_of)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _arith(node.left, value_of), _arith(node.right, value_of)
        if isinstance(node.op, ast.Div):
            if b == 0:
                raise ZeroDivisionError
            q = abs(a) // abs(b)  # bash truncates toward zero
            return q if (a >= 0) == (b >= 0) else -q
        if isinstance(node.op, ast.Pow) and (b < 0 or (abs(a) > 1 and b >= 64)):
            raise ValueError("exponent out of range")
        if type(node.op) in _ARITH_OPS:
            return _ARITH_OPS[type(node.op)](a, b)
    raise ValueError


@dataclass
class Field:
    text: str
    line: int


@dataclass
class Program:
    argv: list[Field]  # python, -m, MODULE, args... ("$@" as ARGS)
    line: int
    prefix_env: dict[str, tuple[str, int]]  # `VAR=x python3 ...`


@dataclass
class ScriptRun:
    """What the script does, as data: its one program and what it set on the way."""
    program: Program
    exported: dict[str, tuple[str, int]]  # name -> (value, line), at the program line
    from_shell: dict[str, int]  # variables taken from this shell's environment -> first line
    notes: list[str]
    secrets: dict[str, Optional[str]]  # secret-looking variables the python line uses -> value (None: unset)
    derived: dict[str, str] = field(default_factory=dict)  # variables whose value came from a secret -> that secret


class Evaluator(SecretTracking):
    def __init__(self, src: str, environ: Mapping[str, str], cwd: str):
        self.src, self.environ, self.cwd = src, environ, cwd
        self.vars: dict[str, str] = {}
        self.exported: dict[str, tuple[str, int]] = {}
        self.from_shell: dict[str, int] = {}
        self.notes: list[str] = []
        self.program: Optional[Program] = None
        self.secrets: dict[str, Optional[str]] = {}
        self.in_program = False
        self.derived: dict[str, tuple[str, int]] = {}  # see SecretTracking
        self.touched: list[str] = []  # the variables read while expanding the current value

    def fail(self, line: int, msg: str, hint: Optional[str] = None):
        raise ConfigError(f"{self.src}:{line}: {msg}", hint)

    # ---- expansion ----
    def lookup(self, name: str, line: int) -> Optional[str]:
        if name in self.vars:
            return self.vars[name]
        if name.isdigit():
            return None
        if name in self.environ:
            self.from_shell.setdefault(name, line)
            if name not in self.derived:
                self.note_value(name, self.environ[name], line, [])
            return self.environ[name]
        return None

    def var(self, p: Part, line: int) -> str:
        self.touched.append(p.text)
        if self.in_program and looks_secret(p.text):
            # the value stays out of the job: verl reads it from the job's env on the cluster
            self.secrets[p.text] = self.vars.get(p.text, self.environ.get(p.text))
            return f"${{oc.env:{p.text}}}"
        v = self.lookup(p.text, line)
        if self.in_program and p.text in self.derived and v is not None \
                and not any(s in v for s in self.secret_values().values()):
            src, at = self.derived[p.text]
            self.fail(line, f"${p.text} (set on line {at}) comes from the secret {src}, but does not hold its value: "
                            "it cannot be written into the job without the secret itself",
                      f"pass {src} to the program through its environment instead (secrets: [{src}])")
        if p.op == "":
            if v is None:
                if p.text.isdigit():
                    self.fail(line, f"script argument ${p.text} is not supported",
                              "pass key=value after the script on the command line instead")
                self.fail(line, f"${p.text} is not set: the script does not set it and this shell's environment has "
                                "no such variable",
                          f"export {p.text}=... before running verl-cluster, or give it a default in the script: "
                          f"${{{p.text}:-value}}")
            return v
        empty = v is None or (p.op.startswith(":") and v == "")
        if p.op.endswith("+"):
            return "" if empty else self.text(p.default, line)
        if not empty:
            return v
        if p.op.endswith("?"):
            self.fail(line, f"${p.text} is not set: {self.text(p.default, line) or 'the script requires it'}",
                      f"export {p.text}=... before running verl-cluster")
        mark = len(self.touched)
        value = self.text(p.default, line)
        if p.op.endswith("="):
            self.vars[p.text] = value
            self.note_value(p.text, value, line, self.touched[mark:])
        return value

    def arith(self, expr: str, line: int) -> str:
        def value_of(name: str) -> int:
            v = self.lookup(name, line) or "0"
            try:
                return int(v)
            except ValueError:
                self.fail(line, f"$(({expr})): ${name} is `{v}`, not an integer")
                return 0
        text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)
        shown = expr if len(expr) <= 60 else expr[:60] + "..."
        if len(text) > MAX_ARITH_CHARS:
            self.fail(line, f"$(({shown})) is longer than {MAX_ARITH_CHARS} characters", "write the number itself")
        try:
            return str(_arith(ast.parse(text.strip(), mode="eval"), value_of))
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
            self.fail(line, f"$(({shown})) is not understood (64-bit integers, + - * / % ** and parentheses are)",
                      "write the number itself")
            return ""

    def command_sub(self, text: str, line: int) -> str:
        words = text.split()
        if words == ["pwd"]:
            self.notes.append(f"line {line}: $(pwd) is this shell's working directory, {self.cwd}")
            return self.cwd
        if words and words[0] == "date" and len(words) <= 2 and (len(words) == 1 or words[1].strip("'\"")[:1] == "+"):
            fmt = words[1].strip("'\"")[1:] if len(words) == 2 else "%a %b %d %H:%M:%S %Z %Y"
            self.notes.append(f"line {line}: $({text.strip()}) is the time of the import, fixed in the job")
            return time.strftime(fmt)
        self.fail(line, f"command substitution `$({text.strip()})` is not understood ($(pwd) and $(date +FMT) are)",
                  "replace it with its value")
        return ""

    def piece(self, p: Part, line: int) -> str:
        if p.kind == "lit":
            return p.text
        if p.kind == "var":
            return self.var(p, line)
        if p.kind == "arith":
            return self.arith(p.text, line)
        if p.kind == "cmd":
            return self.command_sub(p.text, line)
        self.fail(line, '"$@" inside a value is not understood', 'put "$@" on its own at the end of the python line')
        return ""

    def text(self, parts: list[Part], line: int) -> str:
        """A word without field splitting (assignments, defaults)."""
        out = "".join(self.piece(p, line) for p in parts)
        if parts and parts[0].kind == "lit" and not parts[0].quoted and (out == "~" or out.startswith("~/")):
            out = self.lookup("HOME", line) or "~"
        return out

    def fields(self, word: Word) -> list[Field]:
        """A word as bash splits it: unquoted expansions split on whitespace; an empty unquoted one vanishes."""
        real = [p for p in word.parts if p.kind != "lit" or p.text]
        if len(real) == 1 and real[0].kind == "args":
            return [Field(ARGS, word.line)]
        out: list[str] = []
        cur, have = "", False
        for p in word.parts:
            text = self.piece(p, word.line)
            if p.quoted or p.kind == "lit":
                if p.kind == "lit" and not p.quoted and not have and not cur and (text == "~" or text.startswith("~/")):
                    text = (self.lookup("HOME", word.line) or "~") + text[1:]
                cur, have = cur + text, True
                continue
            chunks = text.split()
            if not chunks:
                if text and have:
                    out.append(cur)
                    cur, have = "", False
                continue
            if text[0].isspace() and have:
                out.append(cur)
                cur = ""
            cur, have = cur + chunks[0], True
            for ch in chunks[1:]:
                out.append(cur)
                cur = ch
            if text[-1].isspace():
                out.append(cur)
                cur, have = "", False
        if have:
            out.append(cur)
        return [Field(t, word.line) for t in out]

    # ---- commands ----
    def assignment(self, word: Word) -> Optional[tuple[str, str]]:
        first = word.parts[0] if word.parts else None
        if first is None or first.kind != "lit" or first.quoted:
            return None
        m = ASSIGN.match(first.text)
        if not m:
            return None
        rest = [Part("lit", first.text[m.end():], False)] + word.parts[1:]
        mark = len(self.touched)
        value = self.text(rest, word.line)
        self.note_value(m.group(1), value, word.line, self.touched[mark:])
        return m.group(1), value

    def run(self, commands: list[Command]) -> None:
        for cmd in commands:
            k, prefix = 0, {}
            while k < len(cmd.words) and (a := self.assignment(cmd.words[k])):
                prefix[a[0]] = (a[1], cmd.words[k].line)
                k += 1
            if k == len(cmd.words):
                for name, (value, line) in prefix.items():
                    self.vars[name] = value
                    if name in self.exported:
                        self.exported[name] = (value, line)
                continue
            head = self.fields(cmd.words[k])
            name = head[0].text if head else ""
            self.builtin(name, cmd, k, prefix)

    def builtin(self, name: str, cmd: Command, k: int, prefix: dict) -> None:
        line, rest = cmd.words[k].line, cmd.words[k + 1:]
        if name in SHELL_LOGIC or name.endswith("()"):
            self.fail(line, f"shell logic (`{name}`) is not understood", REDUCE)
        if name == "set":
            return
        if name == "export":
            for w in rest:
                a = self.assignment(w)
                if a:
                    self.vars[a[0]] = a[1]
                    self.exported[a[0]] = (a[1], w.line)
                    continue
                names = [f.text for f in self.fields(w)]
                for n in names:
                    if not NAME.fullmatch(n):
                        self.fail(w.line, f"`export {n}` is not understood", "write export NAME=value")
                    v = self.lookup(n, w.line)
                    if v is not None:
                        self.exported[n] = (v, w.line)
            return
        if name == "unset":
            for w in rest:
                for f in self.fields(w):
                    self.vars.pop(f.text, None)
                    self.exported.pop(f.text, None)
            return
        if name in ("ulimit", "echo", "printf"):
            shown = self.redact(" ".join(f.text for w in cmd.words[k:] for f in self.fields(w)))
            self.notes.append(f"line {line}: `{shown}` not carried" + (
                " (Ray's workers get the limits of the `ray start` that started them)" if name == "ulimit" else ""))
            return
        if PYTHON.fullmatch(name):
            self.in_program = True
            argv = [Field(self.as_job_value(f.text), f.line) for w in cmd.words[k:] for f in self.fields(w)]
            self.in_program = False
            if self.program is not None:
                self.fail(line, f"a second python command (the first is on line {self.program.line})",
                          "one script, one run: keep one python line (split the script)")
            self.program = Program(argv, line, prefix)
            return
        if name == "torchrun":
            self.fail(line, "`torchrun` lines are not imported", "write a job spec with launcher: torchrun "
                                                                  "(see launch/sft_gsm8k.yaml)")
        self.fail(line, f"`{name}` is a command this importer does not run",
                  "run it yourself before submitting (data preparation, downloads), then delete the line")

    def result(self) -> ScriptRun:
        if self.program is None:
            raise ConfigError(f"{self.src}: no `python3 -m MODULE ...` line found",
                              "the script must run verl, e.g. python3 -m verl.trainer.main_ppo key=value ...")
        return ScriptRun(self.program, dict(self.exported), dict(self.from_shell), list(self.notes),
                         dict(self.secrets), {k: src for k, (src, _) in self.derived.items()})


def read_script(text: str, src: str, environ: Optional[Mapping[str, str]] = None,
                cwd: Optional[str] = None) -> ScriptRun:
    ev = Evaluator(src, os.environ if environ is None else environ, cwd or os.getcwd())
    ev.run(Lexer(text, src).commands())
    return ev.result()
