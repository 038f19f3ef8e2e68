"""verl's `gen` in whole poll periods (step_time.polls, polled): the trainer checks the replay buffer at once and then
every ReplayBuffer.poll_interval (2 s), so a generate of R seconds is seen after ceil(R / 2 s) periods, then the
replicas are put to sleep. By hand, and in a plan."""

import math
from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.placement import plan_job, step_time
from verl_cluster.placement.gpus import parse_gpus
from verl_cluster.placement.step_time import polled, polls


def test_without_spread_a_generate_takes_whole_periods():
    assert [polls(r, 2.0, 0.0) for r in (0.3, 1.99, 2.0, 2.01, 5.9, 6.0, 6.1)] == [1, 1, 1, 2, 3, 3, 4]
    assert polls(0.0) == 1.0 and polls(-1.0) == 1.0  # the first check comes before any result: one period at least


def test_with_spread_the_expected_periods_by_hand():
    # R exactly on a period boundary: half the draws pass it
    assert polls(4.0, 2.0, 0.1) == pytest.approx(2.5, abs=1e-4)
    # E[ceil(X)] = 1 + sum over k of P(X > k), X lognormal about 2.6 periods / 2 s
    sigma, raw = 0.1, 2.6
    by_hand = 1 + sum(0.5 * math.erfc(math.log(k * 2.0 / raw) / (sigma * math.sqrt(2))) for k in range(1, 20))
    assert polls(raw, 2.0, sigma) == pytest.approx(by_hand, abs=1e-9)
    # far from a boundary the spread does not matter; a long generate skips the periods it surely passes
    assert polls(1.2, 2.0, 0.1) == pytest.approx(1.0, abs=1e-6)
    assert polls(300.0, 2.0, 0.1) == pytest.approx(150 * math.exp(0.1 ** 2 / 2) + 0.5, abs=0.01)


def test_the_generate_phase_is_its_periods_and_the_sleep():
    raw = {"GENERATE_FIXED_S": 1.0, "DECODE_TOKEN_S": 10000.0, "": 0.4, "GEN_POLL_S": 0.0, "GEN_SLEEP_S": 1.0}
    t = polled(raw)
    r = step_time.GENERATE_FIXED_S + 10000.0 * step_time.DECODE_TOKEN_S + 0.4
    assert step_time.seconds(t) == pytest.approx(
        step_time.GEN_POLL_S * polls(r) + step_time.GEN_SLEEP_S, abs=1e-9)
    # the raw work stays in the terms as it was; the wait is GEN_POLL_S's coefficient
    assert {k: v for k, v in t.items() if k != "GEN_POLL_S"} == {k: v for k, v in raw.items() if k != "GEN_POLL_S"}


def test_a_plan_shows_the_generate_in_whole_periods():
    """The mission's job on 2 H100s: at every fill the plan's gen is the periods its raw work takes, then the
    sleep; the raw work grows with the fill, the phase by whole periods (a short generate: one)."""
    job = load_job(Path(__file__).resolve().parents[2] / "launch" / "gsm8k.yaml", [])
    raws = []
    for fill in (0.2, 0.5, 1.0):
        plan = plan_job(job, parse_gpus("1x2xH100-80GB"), fill=fill)
        terms = plan.terms["time"]["gen"]
        raw = step_time.seconds({k: v for k, v in terms.items() if k not in ("GEN_POLL_S", "GEN_SLEEP_S")})
        assert plan.time["phases_s"]["gen"] == pytest.approx(
            step_time.GEN_POLL_S * polls(raw) + step_time.GEN_SLEEP_S, abs=0.01)
        raws.append(raw)
    assert raws == sorted(raws) and raws[0] < raws[-1]


def test_a_generate_of_thousands_of_periods_is_the_mean_and_half_a_period():
    """Past POLLS_SPREAD periods of spread polls() stops summing a term per period (a response length of millions
    took 30 s to plan): the two sides of the switch agree, and a generate of 10^7 periods costs no more."""
    switch = step_time.POLLS_SPREAD * 2.0 / 0.1
    below, above = polls(switch * (1 - 1e-9), 2.0, 0.1), polls(switch * (1 + 1e-9), 2.0, 0.1)
    assert above == pytest.approx(below, rel=1e-8)
    assert polls(2e7, 2.0, 0.1) == 1e7 * math.exp(0.1 ** 2 / 2) + 0.5
