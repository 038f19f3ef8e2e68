"""The watch loop: follow one attempt until it ends or something is wrong; then classify, heal the cluster the way
`up` does, make a clean slate, and resubmit with verl's resume settings, within the restart budget.

Everything goes through Ray (its Jobs API, State API and GCS node table) and the node script: no agent of our
own, and no `ray stop` — a lost node is brought back by `bring_up`, which restarts only this cluster's processes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, TextIO

from verl_cluster.enums import StrEnum
from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.config.job import JobSpec
from verl_cluster.config.job_shape import JobShape
from verl_cluster.errors import ClusterError
from verl_cluster.records import job_records
from verl_cluster.jobs import ray_jobs
from verl_cluster.watch.detect import LogTracker, NodeMonitor
from verl_cluster.watch.events import Event, Note, Reporter
from verl_cluster.watch.failures import Diagnosis, FailureClass, diagnose
from verl_cluster.watch.progress import Progress, resume_verdict
from verl_cluster.watch.runs import RunState, RunStatus
from verl_cluster.watch.settings import WatchSettings

RESUME = ["trainer.resume_mode=auto"]
API_FAILURES_BEFORE_LOST = 5  # consecutive Jobs API errors (one per poll) before the head counts as lost
LOG_FAILURES_BEFORE_NOTE = 5  # consecutive failed log reads before the watcher says it watches without the log
BUNDLE_TAIL_LINES = 500


class AttemptEnd(StrEnum):
    """How the watcher saw an attempt end; the value is what the run's state keeps."""

    SUCCEEDED = "SUCCEEDED"
    STOPPED = "STOPPED"  # by someone else
    FAILED = "FAILED"
    LOST = "LOST"  # a node (or the head) left the cluster
    HANG = "HANG"


@dataclass
class Outcome:
    status: AttemptEnd
    diagnosis: Optional[Diagnosis] = None
    node: str = ""
    tail: list[str] = field(default_factory=list)
    progress: Progress = field(default_factory=Progress)
    ray_job_id: str = ""


class Watcher:
    def __init__(self, st: RunState, spec: ClusterSpec, job: JobSpec, settings: WatchSettings, reporter: Reporter,
                 stream: Optional[TextIO] = None):
        self.st, self.spec, self.job, self.s, self.rep, self.stream = st, spec, job, settings, reporter, stream
        self.monitor = NodeMonitor(spec)
        self.run_spec = spec  # the nodes the current attempt runs on (fewer after allow_fewer_nodes)

    def emit(self, cls: FailureClass | Note, action: str, evidence: str = "", node: str = "", lines=(),
             sid: str = "") -> Event:
        return self.rep.emit(Event(self.st.run, sid or self.st.current, cls, action, evidence, node, list(lines)))

    def api(self):
        with ray_jobs.connect(self.spec) as api:
            return api

    # ---- the loop ----
    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.monitor.close()

    def _stop_run(self, state: RunStatus, rc: int = 1) -> int:
        self.st.state = state
        self.st.save()
        return rc

    def _run(self) -> int:
        self._adopt_pending()
        self.emit(Note.INFO, "watching", f"restart budget {self.st.restarts}/{self.s.max_restarts} used")
        recorded = self._recorded_end()
        while True:
            sid = self.st.current
            if recorded:  # a watcher before this one ended the attempt itself (then died healing): go on from there
                out, recorded = recorded, None
                self.emit(Note.INFO, "going on from the record", f"{sid} was ended by the watcher before this one "
                          f"({out.diagnosis.cls}: {out.diagnosis.evidence}); healing and resuming", out.node)
            else:
                out = self.watch_attempt(sid)
                self._record(out)
            if out.status == AttemptEnd.SUCCEEDED:
                self.emit(Note.INFO, "done: the run SUCCEEDED", f"{len(self.st.attempts)} attempt(s), "
                          f"{self.st.restarts} restart(s), {self._steps_summary()}")
                return self._stop_run(RunStatus.SUCCEEDED, 0)
            if out.status == AttemptEnd.STOPPED:
                self.emit(Note.INFO, "stopped watching: the job was stopped by someone else", "status STOPPED")
                return self._stop_run(RunStatus.STOPPED)
            d = out.diagnosis or Diagnosis(FailureClass.UNKNOWN, "", "")
            lost = self._lost_steps(out.progress)
            if out.status == AttemptEnd.FAILED:
                self.emit(d.cls, "classified", d.evidence + f"; steps lost: {lost}", out.node, out.tail[-20:])
            if not d.retry:
                self.emit(d.cls, "not retried: the run stops (a restart would fail the same way)",
                          d.evidence + (f"; fix: {d.fix}" if d.fix else ""))
                return self._stop_run(RunStatus.FAILED)
            if self._repeats(d, out.progress):
                self.emit(d.cls, "not retried: the same failure as the attempt before it, before any step ran",
                          d.evidence + (f"; fix: {d.fix}" if d.fix else ""))
                return self._stop_run(RunStatus.FAILED)
            if self.st.restarts >= self.s.max_restarts:
                self.emit(d.cls, f"restart budget spent ({self.st.restarts}/{self.s.max_restarts}): giving up",
                          d.evidence, out.node)
                return self._stop_run(RunStatus.GAVE_UP)
            spec = self.heal()
            if spec is None:
                return self._stop_run(RunStatus.GAVE_UP)
            self.run_spec = spec
            self._clean_slate(sid, out.ray_job_id)
            wait = self.s.backoff(self.st.restarts + 1)
            if wait > 0:
                time.sleep(wait)
            if d.cls == FailureClass.OOM:
                self._room_after_oom(spec)
            self.resubmit(spec, wait)

    def _recorded_end(self) -> Optional[Outcome]:
        """The current attempt's end as run.json has it, when a watcher stopped that attempt itself (a lost node, a
        hang) and did not get to resubmit: its job now reads STOPPED, which is not someone else's stop."""
        a = self.st.attempts[-1] if self.st.attempts else {}
        if not a.get("ended_at") or a.get("status") not in (AttemptEnd.LOST, AttemptEnd.HANG) or not a.get("class"):
            return None
        try:
            cls = FailureClass(a["class"])
        except ValueError:
            return None
        p = Progress(steps=[x for x in (a.get("first_step"), a.get("last_step")) if x is not None],
                     resumed_from=a.get("resumed_from"), count=a.get("steps") or 0)
        return Outcome(AttemptEnd(a["status"]), Diagnosis(cls, "recorded", a.get("evidence", "")), a.get("node", ""),
                       [], p, a.get("ray_job_id", ""))

    def _after_attempt(self, sid: str, progress) -> None:
        """The sequence lengths verl logged (`progress`: the attempt's verl_log.VerlProgress), kept for the next plan
        of this job, and the attempt held against the plan it was submitted with (as `submit`'s follow does both)."""
        from verl_cluster.records import host_speed
        from verl_cluster.records.length_store import remember_run
        from verl_cluster.verl_logs.verl_log import vs_plan_lines

        progress.flush()
        rows, host = progress.vs_plan_both() if progress.predicted else ([], None)
        try:
            remember_run(sid, progress)
            host_speed.remember(sid, progress.predicted, host)  # the machines' speed, for the next plan on them
        except OSError:
            pass  # best effort: a read-only home costs the next plan its measured lengths only
        lines = vs_plan_lines(rows, host)
        if lines:
            self.emit(Note.INFO, "verl vs plan", lines[0], lines=lines[1:], sid=sid)

    def _record(self, out: Outcome) -> None:
        a = self.st.attempts[-1]
        p = out.progress
        a.update(status=out.status, ended_at=time.time(), ray_job_id=out.ray_job_id, first_step=p.first_step,
                 last_step=p.last_step, checkpoint=p.checkpoint, resumed_from=p.resumed_from,
                 steps=p.count)
        if out.diagnosis:
            a.update({"class": out.diagnosis.cls, "evidence": out.diagnosis.evidence, "node": out.node,
                      "signature": out.diagnosis.signature(), "steps_lost": self._lost_steps(p)})
        self.st.save()

    def _checkpoint(self, upto: int = -1) -> int:
        """The newest checkpoint the run has: finished by an attempt, or loaded by one (attempts before `upto`)."""
        best = 0
        for a in self.st.attempts[:upto] if upto >= 0 else self.st.attempts:
            best = max(best, a.get("checkpoint") or 0, a.get("resumed_from") or 0)
        return best

    def _lost_steps(self, p: Progress) -> int:
        return p.lost(max(self._checkpoint(len(self.st.attempts) - 1), p.resumed_from or 0))

    def _repeats(self, d: Diagnosis, p: Progress) -> bool:
        """This attempt ran no step and failed the way the one before it did."""
        if p.first_step is not None or len(self.st.attempts) < 2:
            return False
        return self.st.attempts[-2].get("signature") == d.signature()

    def _steps_summary(self) -> str:
        parts = []
        for a in self.st.attempts:
            if a.get("first_step") is not None:
                parts.append(f"{a['submission_id']}: steps {a['first_step']}..{a.get('last_step')}")
        return "; ".join(parts) or "no step logged"

    # ---- one attempt ----
    def _tracker(self, sid: str) -> LogTracker:
        """The attempt's log reader, resuming where a watcher before this one left it (its state in the run folder)."""
        from verl_cluster.verl_logs.job_log import AgentLog

        return LogTracker(AgentLog(None, sid), self.st.dir / f"log-{sid}.json")

    def _read_log(self, tracker: LogTracker, api) -> str:
        """What the job wrote since the last look; a log that cannot be read is said once (and is no hang: the
        status and the node checks still see a failure)."""
        failures = tracker.failures
        new = tracker.read(api)
        if tracker.failures == LOG_FAILURES_BEFORE_NOTE:
            self.emit(Note.INFO, "watching without the log for now", f"its log cannot be read: {tracker.error}")
        elif failures >= LOG_FAILURES_BEFORE_NOTE and not tracker.failures:
            self.emit(Note.INFO, "reading the log again", f"from byte {tracker.follower.offset}")
        return new

    def watch_attempt(self, sid: str) -> Outcome:
        from verl_cluster.submit.integrations import plan_predictions
        from verl_cluster.verl_logs.run_eta import WATCH_EVERY, EtaTicker

        tracker, expected, next_check, api_errors = self._tracker(sid), None, 0.0, 0
        eta, learned = EtaTicker(WATCH_EVERY), False
        gpus, started, ray_job_id = {}, time.time(), ""
        said_first = False
        resumed = len(self.st.attempts) > 1
        self.monitor.refusals.clear()
        while True:
            try:
                api = self.api()
                row = ray_jobs.job_info(api, sid)
                api_errors = 0
            except ClusterError as e:
                api_errors += 1
                if api_errors < API_FAILURES_BEFORE_LOST:
                    time.sleep(self.s.poll_s)
                    continue
                ray_jobs.close_all()  # the tunnel to the head is dead with it; `up` and a new connect follow
                self.emit(FailureClass.NODE_LOST, "heal the head, resume", f"the Jobs API does not answer: {e.message}",
                          self.spec.head_ip)
                tracker.save()
                return Outcome(AttemptEnd.LOST, Diagnosis(FailureClass.NODE_LOST, "the head is gone", e.message),
                               self.spec.head_ip, tracker.tail[-40:], tracker.progress, ray_job_id)
            if tracker.verl.predicted is None and row.plan:
                tracker.verl.predicted = plan_predictions(row.plan)
            if not learned:  # the run's length and save frequency, until its log says them
                tracker.verl.learn_command(row.entrypoint)
                learned = True
            new = self._read_log(tracker, api)
            progress = tracker.progress
            ray_job_id = row.ray_job_id or ray_job_id
            tracker.show(self.stream, new, sid)
            if new and resumed and not said_first and progress.first_step is not None:
                said_first = True
                self._say_resumed(progress)
            if row.status in ray_jobs.TERMINAL:
                for _ in range(20):  # the driver's last lines (its traceback) are in the log once it has ended
                    if tracker.failures or not tracker.behind:
                        break
                    tracker.show(self.stream, self._read_log(tracker, api), sid)
                progress = tracker.finish()
                self._after_attempt(sid, tracker.verl)
                out = self._ended(row, tracker.tail, expected, (started, gpus), progress)
                out.ray_job_id = ray_job_id
                return out
            now = time.monotonic()
            line = eta.due(tracker.verl.estimate(), now)
            if line:
                self.emit(Note.INFO, "eta", line, sid=sid)
            if row.status == "RUNNING":
                if expected is None:
                    expected = self._alive_configured()
                    gpus, started = self._gpus(), time.time()
                    if not tracker.seen:  # the hang clock starts when it runs: a job may wait PENDING for long
                        tracker.last_change = time.monotonic()
                    if resumed:
                        self.emit(Note.INFO, "running again", f"{sid} is RUNNING")
                if now >= next_check:
                    next_check = now + self.s.node_check_s
                    lost = self.monitor.lost(expected)
                    if lost:
                        self.emit(FailureClass.NODE_LOST, "stop the job, heal the cluster, resume", lost[1], lost[0])
                        self._stop(api, sid)
                        tracker.save()
                        return Outcome(AttemptEnd.LOST,
                                       Diagnosis(FailureClass.NODE_LOST, "a node left the cluster", lost[1]), lost[0],
                                       tracker.tail[-40:], progress, ray_job_id)
                if tracker.quiet_for() > self.s.hang_after_s:
                    ev = (f"no new log line for {tracker.quiet_for():.0f}s (hang_after {self.s.hang_after_s:g}s), "
                          f"last step {progress.last_step}")
                    self.emit(FailureClass.HANG, "collect the hang bundle, stop the job (its last lines are kept), "
                              "resume from its checkpoint", ev, lines=tracker.tail[-20:])
                    stuck = self._hang_bundle(api, sid, ray_job_id, tracker.tail)
                    self._stop(api, sid)
                    tracker.save()
                    fault = self._gpu_fault(started, gpus)
                    if fault:  # a GPU that fell off the bus hangs its collective: the cause, not the symptom
                        return Outcome(AttemptEnd.HANG,
                                       Diagnosis(FailureClass.GPU_FAULT, "a GPU reports a fault", fault[1]), fault[0],
                                       tracker.tail[-40:], progress, ray_job_id)
                    return Outcome(AttemptEnd.HANG, Diagnosis(FailureClass.HANG, "the job stopped making progress",
                                                              ev + (f"; stuck: {stuck}" if stuck else "")),
                                   "", tracker.tail[-40:], progress, ray_job_id)
            if not tracker.behind:  # catching up on a backlog: the next chunk at once
                time.sleep(self.s.poll_s)

    def _say_resumed(self, p: Progress) -> None:
        """The first step of a resumed attempt: where verl says it started, checked against the run's checkpoint."""
        ckpt = self._checkpoint(len(self.st.attempts) - 1)
        verdict, evidence = resume_verdict(p, ckpt)
        if verdict == "scratch":
            self.emit(Note.RESUME_FAILED, "error: the attempt started again from step 1; it keeps running "
                      "(stop it with `verl-cluster stop`) — check trainer.default_local_dir", evidence)
        else:
            self.emit(Note.INFO, f"first step {p.first_step}", evidence)

    def _alive_configured(self) -> set[str]:
        try:
            alive = self.monitor.alive_ips()
        except Exception:  # noqa: BLE001 - no table yet: judge later
            return set()
        # only the nodes this attempt runs on: the GCS may list a lost node as alive for a while after it died
        return alive & {self.run_spec.node_ip(n) for _, n in self.run_spec.nodes()}

    def _gpus(self) -> dict[str, int]:
        try:
            return self.monitor.gpus_by_ip()
        except Exception:  # noqa: BLE001 - no table: NVML is then judged without a count
            return {}

    def _gpu_fault(self, since: float, gpus: dict[str, int]):
        from verl_cluster.watch.gpu_health import gpu_fault

        if not any(gpus.values()):
            return None  # a CPU-only run: nothing for NVML to say
        return gpu_fault(self.run_spec, since, gpus)

    def _ended(self, row, lines: list[str], expected, gpu_ctx, progress: Progress) -> Outcome:
        """`lines`: the end of the log, read after the status was (the same poll's)."""
        if row.status == "SUCCEEDED":
            return Outcome(AttemptEnd.SUCCEEDED, progress=progress)
        if row.status == "STOPPED":
            return Outcome(AttemptEnd.STOPPED, progress=progress)
        lost = None
        for _ in range(2):  # a refused raylet port counts on the second look
            lost = self.monitor.lost(expected) if expected else None
            if lost:
                break
        if not lost:
            fault = self._gpu_fault(*gpu_ctx)
            if fault:
                return Outcome(AttemptEnd.FAILED, Diagnosis(FailureClass.GPU_FAULT, "a GPU reports a fault", fault[1],
                                                   "verl-cluster doctor on that node; a GPU off the bus needs a "
                                                   "reboot"), fault[0], lines[-40:], progress)
        from verl_cluster.verl_logs.verl_log import traceback_block

        d = diagnose(lines, row.message, lost[1] if lost else None, made_progress=progress.first_step is not None,
                     here=self._code_dir())
        # the failing traceback itself (header to error line); else the log's last lines
        return Outcome(AttemptEnd.FAILED, d, lost[0] if lost else "", traceback_block(lines, d.evidence, tail=40),
                       progress)

    def _code_dir(self) -> str:
        """Where the job's code comes from, to look for a module the nodes lack: its working_dir when it has
        one, else the folder submit ran in (never this watcher's own folder); "" when neither is known."""
        from verl_cluster.errors import ConfigError
        from verl_cluster.jobs.request import resolve_working_dir

        try:
            return resolve_working_dir(self.job) or self.st.submit_dir
        except ConfigError:  # the working_dir is gone since: the folder submit ran in still says something
            return self.st.submit_dir

    def _hang_bundle(self, api, sid: str, ray_job_id: str, tail: list[str]) -> str:
        """Collect the bundle into the run folder, with the driver log's last lines (`tail`: what the watcher's
        reader keeps, never the whole log); returns the stuck process, for the hang's evidence."""
        from verl_cluster.watch.bundle import collect

        b = collect(self.run_spec, api, sid, ray_job_id, self.st.dir / f"bundle-{sid}")
        _write_private(self.st.dir / f"bundle-{sid}" / "driver-log-tail.txt",
                       "\n".join(tail[-BUNDLE_TAIL_LINES:]) + "\n")
        self.emit(FailureClass.HANG, "bundle collected", b.summary + (f"; stuck: {b.stuck}" if b.stuck else ""),
                  lines=b.frames)
        return b.stuck

    def _stop(self, api, sid: str) -> None:
        try:
            ray_jobs.stop(api, sid)
        except ClusterError:
            pass  # its node may be the one that is gone; the resubmission has a new id either way

    def _clean_slate(self, sid: str, ray_job_id: str) -> None:
        """Nothing of the previous attempt left (job, actors, placement groups, processes on the GPUs) before the
        next one is submitted: a new vLLM beside an old one fails its memory check."""
        from verl_cluster.watch.clean import clean_slate

        try:
            api = self.api()
        except ClusterError as e:
            self.emit(Note.INFO, "no clean-slate check", f"the Jobs API does not answer: {e.message}")
            return
        slate = clean_slate(self.run_spec, api, sid, ray_job_id, timeout_s=self.s.clean_s,
                            say=lambda text: self.emit(Note.INFO, "waiting for a clean slate", text))
        self.emit(Note.INFO if slate.clean else Note.LEFTOVER,
                  "clean slate" if slate.clean else "resuming anyway: the previous attempt left this behind",
                  slate.summary())

    # ---- heal ----
    def heal(self) -> Optional[ClusterSpec]:
        """The cluster spec to resume on: every node back (`bring_up`, as the CLI's `up`), or — allow_fewer_nodes
        and a feasible plan — the nodes left; None when the wait for a lost node ran out."""
        from verl_cluster.lifecycle.bring_up import bring_up
        from verl_cluster.lifecycle.up import NodeAction

        start = time.monotonic()
        deadline, k = start + self.s.node_wait_s, 0
        while True:
            rep = bring_up(self.spec).report
            bad = [o for o in rep.nodes if not (o.ok or o.action == NodeAction.CHANGED)]
            restarted = [o.host for o in rep.nodes if o.action in (NodeAction.STARTED, NodeAction.RESTARTED)]
            if not bad:
                self._settle()
                self.emit(Note.INFO, "resume", "cluster healthy" + (f"; restarted {', '.join(restarted)}"
                                                                 if restarted else ""))
                return self.spec
            names = ", ".join(o.host for o in bad)
            why = "; ".join(f"{o.host}: {o.reason or o.action}" for o in bad)
            lost_for = time.monotonic() - start
            if self.s.allow_fewer_nodes and all(o.role != "head" for o in bad) and lost_for < self.s.node_grace_s:
                wait = min(self.s.node_grace_s - lost_for, max(0.0, deadline - time.monotonic()))
                self.emit(FailureClass.NODE_LOST, f"waiting {wait:.0f}s (watch.node_grace_s) for {names} before "
                          "going on without it", why, names)
                time.sleep(wait)
                continue
            if self.s.allow_fewer_nodes and all(o.role != "head" for o in bad):
                fewer = replace(self.spec, workers=[w for w in self.spec.workers if w.host not in {o.host for o in bad}])
                feasible, note = self._plan_fits(fewer)
                if feasible:
                    self._settle(frozenset(self.spec.node_ip(n) for _, n in self.spec.nodes())
                                 - {fewer.node_ip(n) for _, n in fewer.nodes()})
                    self.st.nodes = 1 + len(fewer.workers)
                    self.emit(FailureClass.NODE_LOST, f"continue on {self.st.nodes} node(s) without {names}",
                              f"{why}; {note}" if note else why, names)
                    return fewer
                self.emit(FailureClass.NODE_LOST, f"no feasible plan without {names} ({note}); waiting for it", why,
                          names)
            if time.monotonic() >= deadline:
                self.emit(FailureClass.NODE_LOST, f"gave up: {names} did not come back within {self.s.node_wait_s:g}s",
                          why, names)
                return None
            wait = min(self.s.backoff_max_s, max(self.s.backoff_s, 1.0) * 2 ** k,
                       max(0.0, deadline - time.monotonic()))
            self.emit(FailureClass.NODE_LOST, f"waiting {wait:.0f}s for {names} to come back", why, names)
            time.sleep(wait)
            k += 1

    def _settle(self, gone: frozenset[str] = frozenset()) -> None:
        """Wait (bounded) until the GCS has marked dead the old registration of every restarted node and every node
        left out (`gone`): until then the resumed job may place work on a dead registration."""
        deadline = time.monotonic() + self.s.settle_s
        said = False
        while True:
            try:
                stale = self.monitor.stale(gone)
            except Exception:  # noqa: BLE001 - the table is advisory here; `up` just saw every node alive
                return
            if not stale or time.monotonic() >= deadline:
                if stale:
                    self.emit(Note.INFO, "resuming anyway", f"the GCS still lists {', '.join(stale)} alive "
                              f"after {self.s.settle_s:g}s")
                return
            if not said:
                self.emit(Note.INFO, "waiting for the GCS to mark the dead registration dead",
                          f"{', '.join(stale)} still listed alive (the GCS health check has not failed it yet)")
                said = True
            time.sleep(1.0)

    def _plan_fits(self, spec: ClusterSpec) -> tuple[bool, str]:
        """Whether the run fits the nodes left, and — verl loads the checkpoint files of the world size it runs
        on — whether its newest checkpoint is there for the new world size or can be resharded to it."""
        from verl_cluster.submit.integrations import placement_plan

        # a job that states its world (a user line's trainer.nnodes) is planned at the nodes left, as resubmit sends it
        job = self.st.job_input([f"trainer.nnodes={1 + len(spec.workers)}"]).job() if self.job.get("trainer.nnodes") \
            else self.job
        plan = placement_plan(job, spec)
        if plan.feasible is False:
            return False, plan.note
        # the plan's world size; a job with no plan (not a verl trainer) runs on the nodes left, each with the
        # ranks its trainer.n_gpus_per_node states
        nodes = 1 + len(spec.workers)
        world = (JobShape.of_overrides(plan.overrides).world
                 or JobShape.of_overrides(self.job).at_nodes(nodes).world or 0)
        folder = str(self.job.get("trainer.default_local_dir") or "")
        gone = [n.host for _, n in self.spec.nodes() if n.host not in {x.host for _, x in spec.nodes()}]
        if folder and gone:  # checked where the run goes on (the head), before anything is resharded or resubmitted
            from verl_cluster.watch.shared_dir import missing_ranks

            incomplete = missing_ranks(spec, folder, gone)
            if incomplete:
                return False, incomplete
        ok, why = self._reshard_for(world)
        return ok, plan.note + (f"; {why}" if why else "")

    def _reshard_for(self, world: int) -> tuple[bool, str]:
        """(can resume on `world` GPUs, what was done). Resharded here when the checkpoint folder is visible on
        this machine (shared storage); where it is not, verl's own load decides."""
        from verl_cluster.reshard import NotReshardable, apply_reshard, plan_reshard, resume_world_size_problem

        folder = str(self.job.get("trainer.default_local_dir") or "")
        if not world or not folder:
            return True, ""
        try:
            if not resume_world_size_problem(folder, world):
                return True, ""
            plan = plan_reshard(folder, world)
            if plan.nothing_to_do:
                return True, ""
            done = apply_reshard(plan)
        except NotReshardable as e:
            return False, f"the checkpoint cannot be resumed on {world} GPUs: {e.message}"
        except Exception as e:  # noqa: BLE001 - the folder is untrusted: whatever an odd file makes fail, the run waits
            return False, (f"resharding the checkpoint to {world} GPUs failed: "
                           f"{getattr(e, 'message', None) or f'{type(e).__name__}: {e}'}"[:400])
        p = done.plan
        return True, (f"resharded the newest checkpoint to {world} GPUs ({Path(p.step_dir).name}, "
                      f"{'+'.join(p.roles)}: {p.from_world_size} -> {p.world_size} ranks, "
                      f"{done.bytes_written / 2**20:.0f} MiB in {done.seconds:.1f}s)")

    def _room_after_oom(self, spec: ClusterSpec) -> None:
        """An OOM under a plan that ran a phase at the GPU's limit: the next attempts are planned with room."""
        from verl_cluster.watch.room import room_after_oom

        old = list(self.st.overrides)
        base = self.st.job_input()
        try:
            new, what = room_after_oom(lambda ov: replace(base, overrides=tuple(ov)).job(), old, spec)
        except Exception as e:  # noqa: BLE001 - planning trouble must not stop the resume itself
            new, what = old, f"could not plan again ({getattr(e, 'message', None) or e}): resuming with the same settings"
        self.st.overrides = new
        self.st.save()
        self.emit(FailureClass.OOM, "re-planned with room" if new != old else "same settings", what)

    # ---- resume ----
    def resubmit(self, spec: ClusterSpec, waited: float) -> str:
        from verl_cluster.submit.pipeline import plan_submission

        prev = self.st.current
        sid = f"{self.st.run}-r{len(self.st.attempts)}"
        self.st.pending = sid
        self.st.save()
        # on fewer nodes the world shrinks: the job's own trainer.nnodes (a user line states it) would wait forever
        # for a placement group on the node that is gone
        ji = self.st.job_input(RESUME + ([f"trainer.nnodes={self.st.nodes}"] if self.st.nodes else []))
        job = ji.job()
        sub = plan_submission(job, self.st.cluster_file, launcher="ray", run_checks=False, spec=spec)
        meta = {**sub.request.metadata, "verl_cluster.run": self.st.run, "verl_cluster.previous": prev,
                "verl_cluster.attempt": str(len(self.st.attempts))}
        req = replace(sub.request, submission_id=sid, metadata=meta)
        ray_jobs.submit(self.api(), req)
        job_records.record(sid, self.st.cluster_file, self.spec.cluster_name, job.name,
                           job_input=self.st.job_input().to_json(), run=self.st.run, previous=prev)
        self.st.attempts.append({"submission_id": sid, "started_at": time.time(), "previous": prev})
        self.st.restarts += 1
        self.st.pending = None
        self.st.save()
        ckpt = self._checkpoint()
        self.emit(Note.INFO, "watching the new attempt",
                  f"resubmitted after {waited:.1f}s back-off with trainer.resume_mode=auto "
                  f"(restart {self.st.restarts}/{self.s.max_restarts}, previous {prev}, newest checkpoint "
                  f"{f'global_step_{ckpt}' if ckpt else 'none'})", sid=sid)
        return sid

    def _adopt_pending(self) -> None:
        """A watcher killed while resubmitting may have left a job running under st.pending: adopt it rather than
        submit a second one."""
        sid = self.st.pending
        if not sid:
            return
        try:
            ray_jobs.job_info(self.api(), sid)
        except ClusterError:
            sid = None  # it never reached Ray: the loop resubmits as usual
        if sid:
            self.st.attempts.append({"submission_id": sid, "started_at": time.time(), "previous": self.st.current})
            self.st.restarts += 1
        self.st.pending = None
        self.st.save()


def _write_private(path, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except OSError:
        pass  # the bundle goes on without it
