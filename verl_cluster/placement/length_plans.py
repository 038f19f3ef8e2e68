"""A job planned twice: at the worst case and at the lengths known (placement/lengths.py); `submit` runs the first
plan that fits and refuses only when neither does."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from verl_cluster.config.job import JobSpec
from verl_cluster.facts.model import NodeFacts
from verl_cluster.placement.lengths import Lengths
from verl_cluster.placement.plan import plan as plan_job
from verl_cluster.placement.settings import read_settings

PADDED = ("without use_remove_padding every sequence is padded to max_prompt_length + max_response_length, so "
          "shorter real lengths do not lower memory")


@dataclass(frozen=True)
class LengthPlans:
    """The job planned at the worst case and at the lengths known (None when nothing is known)."""
    worst: Any  # Plan
    known: Any  # Optional[Plan]
    lengths: Lengths
    padded: bool = False  # no use_remove_padding (off, or no flash-attn): every sequence is padded to the maximum

    @property
    def chosen(self):
        """The plan to run: the worst case's when it fits (room for any lengths), else the known lengths'."""
        if self.worst.feasible or self.known is None:
            return self.worst
        return self.known

    @property
    def verdict(self) -> str:
        if self.worst.not_covered:
            return "not-covered"
        if self.worst.feasible:
            return "fits"
        return "fits-at-known-lengths" if self.known is not None and self.known.feasible else "does-not-fit"

    def worst_phases(self) -> list[str]:
        return [f"{ph.phase}" for r in self.worst.roles for ph in r.phases if not ph.fits]

    def warning(self) -> str:
        """For a plan that fits only at the known lengths: the lengths, what would not fit at the worst case, and
        what happens if real sequences run longer."""
        if self.verdict != "fits-at-known-lengths":
            return ""
        phases = ", ".join(dict.fromkeys(self.worst_phases())) or "a phase"
        return (f"planned at the lengths known, not the worst case: {self.lengths.line()}. At the worst case (every "
                f"sequence {self.lengths.prompt_limit}+{self.lengths.response_limit} tokens) {phases} would not fit "
                f"({self.worst.binding}). If real sequences run longer and a GPU runs out of memory, `submit --watch` "
                "resumes the run and re-plans a phase that ran at the GPU's limit with room")

    def refusal(self) -> str:
        """Why nothing known makes it fit, with the numbers of both plans."""
        if self.verdict != "does-not-fit":
            return ""
        worst = f"at the worst case ({self.lengths.seq_limit} tokens a sequence): {self.worst.binding}"
        if self.known is None:
            return f"does not fit {worst}; nothing is known of the real lengths ({self.lengths.line()})"
        return (f"does not fit {worst}; nor at the lengths known — {self.lengths.line()}: {self.known.binding}"
                + (f" ({PADDED})" if self.padded else ""))

    def refusal_hint(self) -> str:
        plan = self.known or self.worst
        tips = []
        if not self.lengths.response_known and self.lengths.fill_stated is None:
            tips.append("if your responses are shorter, state placement.mean_response_tokens (or placement.fill)")
        if not self.lengths.prompt_known and self.lengths.fill_stated is None:
            tips.append("let preflight measure the prompts (data.train_files on the nodes, model.path with a tokenizer)")
        if plan.fixes:
            tips.append(plan.fixes[0])
        return "; ".join(tips) or "verl-cluster plan JOB shows the numbers"


def plan_lengths(job: JobSpec, facts: list[NodeFacts], lengths: Lengths, *, strategy: Optional[str] = None,
                 shape=None, bus: tuple = ()) -> LengthPlans:
    """Plan at the worst case and, when something known makes sequences shorter, at the known lengths; each Plan
    carries the lengths document and the worst case's verdict (`plan --json`'s `lengths` and `worst_case`).
    `bus`: `check`'s recorded measurements of the cluster (facts/measured_bus.py recorded)."""
    worst = plan_job(job, facts, strategy=strategy, fill=1.0, shape=shape, bus=bus)
    s = read_settings(job)
    padded = not (s.remove_padding_actor or s.remove_padding_critic) or not worst.attn.startswith("flash")
    known = plan_job(job, facts, strategy=strategy, fill=lengths.fill, shape=shape, bus=bus) if lengths.known else None
    summary = {"feasible": worst.feasible, "binding": worst.binding, "problems": list(worst.problems),
               "fits_at_fill": worst.fits_at_fill}
    doc = lengths.to_dict()
    worst = replace(worst, lengths=doc, worst_case=summary)
    if known is not None:
        known = replace(known, lengths=doc, worst_case=summary, reasons=known.reasons + (f"lengths: {lengths.line()}",))
    return LengthPlans(worst, known, lengths, padded)
