"""Which values of a script being imported are secret: a secret-named variable's, a URL's credentials, and every
value made from one through any chain of assignments or holding one's value. The python line gets a reference
verl resolves on the cluster (`${oc.env:HF_TOKEN}`) instead of the value; nothing printed holds one."""

from __future__ import annotations

from typing import Mapping, Optional

from verl_cluster.config.names import MASK, has_url_credentials, is_secret_name

MIN_SECRET_CHARS = 6  # a secret's value is looked for inside other values from this length ("1" is everywhere)


class SecretTracking:
    """Mixed into the script evaluator, whose variables (`vars`) and environment (`environ`) it reads."""

    environ: Mapping[str, str]
    vars: dict[str, str]
    secrets: dict[str, Optional[str]]  # secrets the python line uses -> value
    derived: dict[str, tuple[str, int]]  # a variable that holds or came from a secret -> (that secret, its line)

    def secret_values(self) -> dict[str, str]:
        """Every secret this import knows, name -> value: secret-named variables of the script and of this shell,
        and values carrying a URL's credentials (longest first, so a value is recognised before a part of it)."""
        out: dict[str, str] = {}
        for source in (self.environ, self.vars):  # the script's own value wins
            for k, v in source.items():
                if v and len(v) >= MIN_SECRET_CHARS and (is_secret_name(k) or has_url_credentials(v)):
                    out[k] = v
        return dict(sorted(out.items(), key=lambda kv: -len(kv[1])))

    def source_of(self, name: str, value: Optional[str] = None) -> Optional[str]:
        """The secret a variable's value is, or came from; None for a plain one."""
        if is_secret_name(name):
            return name
        if name in self.derived:
            return self.derived[name][0]
        if value is not None:
            if has_url_credentials(value):
                return name
            return next((k for k, v in self.secret_values().items() if v in value), None)
        return None

    def note_value(self, name: str, value: str, line: int, touched: list[str]) -> None:
        """Remember whether `name`, just set to `value`, holds or came from a secret."""
        src = next((s for s in (self.source_of(t) for t in touched) if s), None)
        if src is None and not is_secret_name(name):
            src = self.source_of(name, value)
        if src and src != name:
            self.derived[name] = (src, line)
        else:
            self.derived.pop(name, None)

    def as_job_value(self, text: str) -> str:
        """A python-line word with every secret's value replaced by a reference verl resolves on the cluster from
        the job's environment (the secret goes there)."""
        for k, v in self.secret_values().items():
            if v in text:
                text = text.replace(v, f"${{oc.env:{k}}}")
                self.secrets[k] = v
        return text

    def redact(self, text: str) -> str:
        for v in self.secret_values().values():
            text = text.replace(v, MASK)
        return text
