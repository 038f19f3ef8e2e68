"""What a host, a user, a path or an environment variable name may be. Checked where config is read (and again at
the SSH boundary), because these values reach places that parse them: ~/.ssh/config substitutes the host into a
ProxyCommand that is split into words, `env` reads a leading `-` as an option, a shell reads `export K=...`."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Callable, Iterable, Mapping, Optional

_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}\$?")  # POSIX portable names (+ a trailing $ for machines)
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ZONE = re.compile(r"[A-Za-z0-9_.-]+")
_SHELL_SPECIAL = set(";&|$`<>")


def _control(s: str) -> Optional[str]:
    bad = next((c for c in s if ord(c) < 32 or ord(c) == 127), None)
    return None if bad is None else f"holds a control character ({bad!r})"


def ip_problem(s: str) -> Optional[str]:
    addr, _, zone = s.partition("%")
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return "is not an IPv4 or IPv6 address"
    if zone and not (":" in addr and _ZONE.fullmatch(zone)):
        return "has a bad IPv6 zone"
    return None


def host_problem(s: str) -> Optional[str]:
    """A DNS/ssh-config host name, an IPv4 address or an IPv6 literal (no brackets, no port, no spaces)."""
    if ip_problem(s) is None:
        return None
    if len(s) <= 253 and _HOSTNAME.fullmatch(s) and not s.replace(".", "").isdigit():
        return None
    return "is not a host name, IPv4 or IPv6 address"


def user_problem(s: str) -> Optional[str]:
    return None if _USER.fullmatch(s) else "is not a user name (letters, digits, _ . -, not starting with -)"


def path_problem(s: str) -> Optional[str]:
    return _control(s)


def executable_problem(s: str) -> Optional[str]:
    """A program run as one argv word: a path, without control or shell characters (a `;` there is a mistake)."""
    if _control(s):
        return _control(s)
    if not s.strip() or set(s) & _SHELL_SPECIAL:
        return "is not a program path (it is run as one word: no ; & | $ ` < >)"
    return None


def env_name_problem(s: str) -> Optional[str]:
    return None if _ENV.fullmatch(s) else "is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"


KINDS: dict[str, Callable[[str], Optional[str]]] = {
    "host": host_problem, "ip": ip_problem, "user": user_problem, "path": path_problem,
    "executable": executable_problem, "env_name": env_name_problem,
}
HINTS = {
    "host": "write a host name (gpu-1, gpu-1.example.org), an IPv4 address or an IPv6 address; set the SSH port "
            "with ssh.port / ssh_port",
    "ip": "write the address Ray advertises, e.g. 10.0.0.2",
    "user": "write the login name only; the port and options have their own fields",
    "path": "remove the control characters",
    "executable": "write the absolute path of the program, e.g. /opt/venv/bin/ray",
    "env_name": "environment variable names are letters, digits and _, not starting with a digit",
}


def is_env_name(s: str) -> bool:
    return env_name_problem(s) is None


# A variable is secret when its name is listed (a job's `secrets:`), when a word of it (split at `_`) holds SECRET,
# PASSWORD, PASSWD, CREDENTIAL or WEBHOOK, when its last word ends with TOKEN, KEY or PASS (HF_TOKEN, WANDB_API_KEY,
# OPENAI_APIKEY, DB_PASS) or is PAT (GITHUB_PAT). Not when the last word says it is a path (RAY_AUTH_TOKEN_PATH),
# and not for TOKEN/KEY inside a name (TOKENIZERS_PARALLELISM, MAX_TOKEN_LEN, KEYBOARD_LAYOUT): verl scripts set
# those as settings. Any value: the credentials of a URL (scheme://user:password@host) are masked.
STRONG_WORDS = ("SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "WEBHOOK")
LAST_WORD_ENDINGS = ("TOKEN", "KEY", "PASS")
LAST_WORDS = ("PAT",)  # a personal access token
_NOT_SECRET_LAST = ("PATH", "PATHS", "FILE", "DIR")
MASK = "***"


def is_secret_name(name: str, listed: Iterable[str] = ()) -> bool:
    if name in listed:
        return True
    words = [w for w in str(name).upper().split("_") if w]
    if not words or words[-1] in _NOT_SECRET_LAST:
        return False
    return (any(s in w for w in words for s in STRONG_WORDS) or words[-1].endswith(LAST_WORD_ENDINGS)
            or words[-1] in LAST_WORDS)


# scheme://userinfo@ : the userinfo (user, user:password, a token as user) ends at the first / ? # or space
_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@\s]+)@")


def has_url_credentials(value: Any) -> bool:
    return isinstance(value, str) and _URL_USERINFO.search(value) is not None


def mask_url_credentials(value: str) -> str:
    """postgres://u:p@h -> postgres://***@h (the host stays readable)."""
    return _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", value)


def masked_env(env: Mapping[str, Any], listed: Iterable[str] = ()) -> dict[str, Any]:
    """The environment as it may be printed: every secret value replaced by ***, a URL's credentials too."""
    listed = tuple(listed)
    return {k: (MASK if is_secret_name(k, listed) else mask_url_credentials(v) if isinstance(v, str) else v)
            for k, v in env.items()}
