"""The sequence lengths a plan is made for, and where each came from.

verl pads nothing under use_remove_padding: a micro batch holds the tokens its sequences really have, so memory
follows the data's lengths, not `max_prompt_length + max_response_length`. What is known, first that applies:

- prompts: measured on the training parquet (submit/prompt_probe.py: the chat template and tokenizer where the
  node has them, else characters at a stated ratio), else verl's `prompt_length/mean` logged by an earlier run of
  the same job (records/length_store.py), else the worst case, `data.max_prompt_length`;
- responses: `placement.mean_response_tokens`, else verl's logged `response_length/mean` (the largest per-step
  mean: responses grow as RL trains), else the worst case, `data.max_response_length`;
- `--fill` or `placement.fill` (the average share of prompt+response) replaces both.

`length_plans.plan_lengths` plans at the worst case and at these lengths. Pure: measurements and logged lengths come
in as arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from verl_cluster.config.job import JobSpec
from verl_cluster.errors import ConfigError


# How much fewer tokens a step's batch may hold than the planned mean (lengths vary from step to step): such a step
# can pack into one micro batch less, each near the budget
TOTAL_SWING = 0.15


def micro_tokens(total: float, budget: int, longest: float) -> float:
    """Tokens of the largest micro batch on one GPU when a rank's batch of `total` tokens runs under a token
    budget, as verl 0.9 balances them (docs/placement.md, "Token budgets")."""
    if total <= budget:
        return float(total)
    k = math.ceil(total / budget - 1e-9)
    if total * (1 - TOTAL_SWING) <= (k - 1) * budget:
        return float(budget)
    return min(float(budget), total / k + longest)


@dataclass(frozen=True)
class PromptStats:
    """Prompt token lengths measured on a sample of the training files (prompt_probe.measure's document)."""
    files: tuple[str, ...]
    rows: int
    sampled: int
    mean: float
    p50: int
    p95: int
    max: int
    over_limit: int  # sampled prompts longer than data.max_prompt_length
    limit: int
    mean_kept: float  # the mean of those verl keeps when it filters over-long prompts
    mean_truncated: float  # the mean when it left-truncates them to the limit
    method: str  # tokenizer | characters
    how: str  # "chat template applied", or why no tokenizer was used
    tokenizer: str = ""
    chars_per_token: float = 0.0

    @classmethod
    def from_probe(cls, d: dict[str, Any]) -> "PromptStats":
        return cls(tuple(d.get("files") or ()), int(d["rows"]), int(d["sampled"]), float(d["mean"]), int(d["p50"]),
                   int(d["p95"]), int(d["max"]), int(d["over_limit"]), int(d["limit"]), float(d["mean_kept"]),
                   float(d["mean_truncated"]), str(d["method"]), str(d.get("how") or ""), str(d.get("tokenizer") or ""),
                   float(d.get("chars_per_token") or 0.0))

    def mean_used(self, filter_overlong: bool) -> float:
        """The mean prompt verl trains on: over-long prompts dropped (filter_overlong_prompts) or cut to the limit
        (verl 0.9's agent loop left-truncates them)."""
        return self.mean_kept if filter_overlong and self.mean_kept > 0 else self.mean_truncated

    def where(self) -> str:
        files = ", ".join(self.files) if len(self.files) <= 2 else f"{len(self.files)} files"
        rows = f"all {self.rows} rows" if self.sampled >= self.rows else f"{self.sampled} of {self.rows} rows"
        if self.method == "tokenizer":
            return f"measured on {rows} of {files} with the tokenizer of {self.tokenizer} ({self.how})"
        return (f"estimated on {rows} of {files} from characters at {self.chars_per_token:g} per token plus the chat "
                f"template's markers, since {self.how}")

    def to_dict(self) -> dict[str, Any]:
        return {"files": list(self.files), "rows": self.rows, "sampled": self.sampled, "mean": round(self.mean, 1),
                "p50": self.p50, "p95": self.p95, "max": self.max, "over_limit": self.over_limit, "limit": self.limit,
                "mean_kept": round(self.mean_kept, 1), "mean_truncated": round(self.mean_truncated, 1),
                "method": self.method, "how": self.how, "tokenizer": self.tokenizer,
                **({"chars_per_token": self.chars_per_token} if self.method == "characters" else {})}


@dataclass(frozen=True)
class Lengths:
    prompt_limit: int  # data.max_prompt_length
    response_limit: int  # data.max_response_length
    prompt_mean: float
    prompt_source: str
    response_mean: float
    response_source: str
    fill_stated: Optional[float] = None  # --fill / placement.fill: replaces both means
    fill_source: str = ""
    prompts: Optional[PromptStats] = None
    logged: Optional[dict[str, Any]] = None
    prompt_known: bool = False  # measured or logged (else the worst case, its limit)
    response_known: bool = False  # stated or logged

    @property
    def seq_limit(self) -> int:
        return self.prompt_limit + self.response_limit

    @property
    def fill(self) -> float:
        if self.fill_stated is not None:
            return self.fill_stated
        return min(1.0, (self.prompt_mean + self.response_mean) / self.seq_limit)

    @property
    def known(self) -> bool:
        """Does anything known make sequences shorter than the worst case?"""
        return self.fill < 1.0

    def line(self) -> str:
        """One sentence: the lengths, where each came from, and the share of the maximum they make."""
        tokens = f"{self.fill * self.seq_limit:.0f} of {self.seq_limit} tokens a sequence (fill {self.fill:.3g})"
        if self.fill_stated is not None:
            return f"sequences average {tokens}, as {self.fill_source} states"
        p = self.prompts
        spread = f" (p50 {p.p50}, p95 {p.p95}, max {p.max})" if p is not None and self.prompt_source == p.where() else ""
        return (f"prompts {self.prompt_mean:.0f} tokens on average{spread}, {self.prompt_source}; responses "
                f"{self.response_mean:.0f}, {self.response_source}: {tokens}")

    def to_dict(self) -> dict[str, Any]:
        return {"fill": round(self.fill, 4), "tokens_per_sequence": round(self.fill * self.seq_limit, 1),
                "max_prompt_length": self.prompt_limit, "max_response_length": self.response_limit,
                "prompt": {"mean": round(self.prompt_mean, 1), "source": self.prompt_source,
                           **({"measured": self.prompts.to_dict()} if self.prompts is not None else {})},
                "response": {"mean": round(self.response_mean, 1), "source": self.response_source},
                "fill_stated": self.fill_stated, "fill_source": self.fill_source or None,
                "logged": self.logged, "known": self.known}


def _limits(job: JobSpec) -> tuple[int, int, bool]:
    from verl_cluster.placement.settings import read_settings

    s = read_settings(job)
    flt = job.get("data.filter_overlong_prompts", False)  # verl 0.9.1's data config default
    return s.prompt_len, s.response_len, flt is True or str(flt).lower() == "true"


def field_origin(job: JobSpec, name: str) -> str:
    """'file:line' of `placement.<name>` in the job file, else the file (or the command line)."""
    from verl_cluster.config.loader import read_yaml

    try:
        _, lines = read_yaml(job.source)
    except Exception:  # noqa: BLE001 - a job built in memory or from a script: no line to name
        return job.source
    line = lines.get(("placement", name))
    return f"{job.source}:{line}" if line else f"{job.source} (or the command line)"


def check_placement_lengths(job: JobSpec) -> None:
    """placement.fill in (0, 1]; placement.mean_response_tokens a positive count within max_response_length."""
    p = job.placement
    _, response_limit, _ = _limits(job)
    if p.fill is not None and not (0.0 < p.fill <= 1.0):
        raise ConfigError(f"{field_origin(job, 'fill')}: placement.fill must be in (0, 1], got {p.fill}",
                          "the average share of max_prompt_length + max_response_length a sequence uses, e.g. 0.25")
    m = p.mean_response_tokens
    if m is not None and not (0 < m <= response_limit):
        raise ConfigError(f"{field_origin(job, 'mean_response_tokens')}: placement.mean_response_tokens must be "
                          f"between 1 and data.max_response_length ({response_limit}), got {m}",
                          "the responses' average length in tokens (verl logs it as response_length/mean)")


def resolve_lengths(job: JobSpec, *, prompts: Optional[PromptStats] = None, logged: Optional[dict] = None,
                    fill: Optional[float] = None, fill_source: str = "--fill") -> Lengths:
    """The lengths to plan at, each with its source. `logged`: length_store's record of an earlier run."""
    check_placement_lengths(job)
    plim, rlim, filter_overlong = _limits(job)
    if fill is not None and not (0.0 < fill <= 1.0):
        raise ConfigError(f"{fill_source} must be in (0, 1], got {fill}")
    if fill is None and job.placement.fill is not None:
        fill, fill_source = job.placement.fill, f"placement.fill in {field_origin(job, 'fill')}"
    run = f"run {logged.get('submission_id') or '?'}" if logged else ""
    prompt_known = response_known = True
    if prompts is not None:
        pm, ps = min(prompts.mean_used(filter_overlong), float(plim)), prompts.where()
    elif logged and logged.get("prompt_length_mean"):
        pm = min(float(logged["prompt_length_mean"]), float(plim))
        ps = f"verl's prompt_length/mean logged by {run} of job {job.name}"
    else:
        pm, ps = float(plim), "worst case: data.max_prompt_length (no data measured, no earlier run logged)"
        prompt_known = False
    if job.placement.mean_response_tokens is not None:
        rm = float(job.placement.mean_response_tokens)
        rs = f"placement.mean_response_tokens in {field_origin(job, 'mean_response_tokens')}"
    elif logged and logged.get("response_length_mean"):
        rm = min(float(logged["response_length_mean"]), float(rlim))
        rs = (f"verl's response_length/mean logged by {run} of job {job.name} (the largest of "
              f"{logged.get('steps', '?')} steps)")
    else:
        rm, rs = float(rlim), ("worst case: data.max_response_length (responses unknown: state "
                               "placement.mean_response_tokens, or run once and the logged mean is used)")
        response_known = False
    return Lengths(plim, rlim, pm, ps, rm, rs, fill, fill_source if fill is not None else "", prompts, logged,
                   prompt_known, response_known)
