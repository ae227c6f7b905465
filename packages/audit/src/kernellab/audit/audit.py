"""The audit: every check in order, each recorded with its outcome, then a verdict with reasons.

1. reports: schema and canonical-JSON sha256 of both (``source_reports_sha256``), every derived number
   against the raw data it is derived from, the signatures (against ``--trusted-keys``), and the
   device each was made on against this one;
2. sources: the recorded source sha256s against the files present now;
3. replay: every (case, mode) pair of both revisions, alternately, each in its own process, with
   output validation after every batch and changed-input graph replay where graphs apply;
4. artifacts: the recorded built files against the files the replay built or loaded;
5. claims: each claimed gain against the replayed one, within the noise the replay measured.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

from kernellab.harness import assemble, consistency, gate, provenance, signing
from kernellab.harness import report as report_io
from kernellab.harness.revision import Extension, RevisionError, run_sides

from . import trees, verdict

SCHEMA = "kernellab.audit/1"
HASH_FIELD = "audit_sha256"
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
INCONSISTENCIES_SHOWN = 5  # named in a check's detail and its fail reason; the rest are counted


@dataclass
class Options:
    rounds: int | None = None  # None: the candidate report's own
    samples: int | None = None
    tolerance: float = 0.10  # how far a claim may sit outside the replay's interval, besides drift
    progress: bool = True
    max_rounds: int | None = None  # extra replay rounds for wide intervals (None: three times the rounds)
    time_limit_s: float = 600.0  # no extra replay round starts after this
    trusted_keys: Path | None = None  # public keys that must have signed both reports (a PEM file or directory)
    ray: str | None = None  # replay on a Ray cluster at this address ("": a local one); None: in this process
    case_timeout_s: float = 3600.0  # on the cluster: a replayed case running longer kills its task


class Audit:
    def __init__(self, reference: Path, candidate: Path, repo: Path, options: Options):
        self.paths = {"reference": Path(reference), "candidate": Path(candidate)}
        self.repo = Path(repo)
        self.options = options
        self.checks: list[dict] = []
        self.failures: list[str] = []
        self.doubts: list[str] = []
        self.out: dict = {"schema": SCHEMA, "status": None}
        self.foreign_device = False  # a report made on another device: its timings cannot be judged here
        self.versus: list[tuple[dict, dict | None]] = []  # the candidate's claims against its control (``_replay``)

    def check(self, name: str, passed: bool | None, detail, *, fail: str | None = None, doubt: str | None = None):
        """Record one check; ``passed`` None means it could not be decided."""
        self.checks.append({"name": name, "passed": passed, "detail": detail})
        if passed is False and fail:
            self.failures.append(fail)
        if passed is None and doubt:
            self.doubts.append(doubt)

    # ---- the pipeline -----------------------------------------------------------------------
    def run(self) -> dict:
        reports = self._load_reports()
        if reports is not None:
            with tempfile.TemporaryDirectory(prefix="kernellab-audit-") as tmp:
                roots = self._check_sources(reports, Path(tmp))
                if roots is not None:
                    self._replay(reports, roots)
        return self._finish()

    def _load_reports(self) -> dict | None:
        reports, hashes = {}, {}
        try:
            trusted = signing.load_trusted(self.options.trusted_keys) if self.options.trusted_keys else None
        except signing.SigningError as e:
            self.check("trusted keys", False, str(e), fail=f"--trusted-keys: {e}")
            return None
        for side, path in self.paths.items():
            try:
                reports[side] = report_io.load(path)
                hashes[side] = reports[side][report_io.HASH_FIELD]
                self.check(f"{side} report hash and schema", True, str(path))
            except report_io.ReportError as e:
                self.check(f"{side} report hash and schema", False, str(e), fail=str(e))
                continue
            for name, passed, detail in integrity(reports[side], trusted):
                self.check(f"{side} report {name}", passed, detail,
                           fail=f"{side} report {name}: {detail}" if passed is False else None)
        self.out["source_reports_sha256"] = hashes
        if len(reports) < 2:
            return None
        kinds = {side: r["kind"] for side, r in reports.items()}
        if set(kinds.values()) != {"run"}:
            msg = f"the audit takes two run reports, got {kinds}"
            self.check("report kinds", False, msg, fail=msg)
            return None
        if reports["reference"]["suite"] != reports["candidate"]["suite"]:
            msg = (f"the reports measure different suites: {reports['reference']['suite']!r} and "
                   f"{reports['candidate']['suite']!r}")
            self.check("same suite", False, msg, fail=msg)
            return None
        self.out["suite"] = reports["candidate"]["suite"]
        for side, rep in (reports.items() if self.options.ray is None else ()):  # a cluster: each problem on its own
            reason = device_mismatch(rep)
            self.foreign_device |= reason is not None
            self.check(f"{side} report made on this device", None if reason else True,
                       reason or "the recorded device is this one",
                       doubt=f"{side} report {reason}: its timing claims cannot be judged here" if reason else None)
        return None if self.failures else reports

    def _check_sources(self, reports: dict, tmp: Path) -> dict | None:
        roots = {}
        for side, rep in reports.items():
            try:
                tree = trees.locate(rep, self.repo, tmp / side)
            except RevisionError as e:
                self.check(f"{side} sources present", False, str(e), fail=f"{side}: {e}")
                return None
            changes = trees.source_changes(rep, tree["root"])
            bad = {k: v for k, v in changes.items() if v}
            self.check(f"{side} sources unchanged since the report", not bad, {"tree": tree["source"], **changes},
                       fail=f"{side}: source files differ from the report ({tree['source']}): {bad}")
            self._check_impl_sources(side, rep, tree["root"])
            roots[side] = tree["root"]
        return None if self.failures else roots

    def _check_impl_sources(self, side: str, report: dict, root) -> None:
        """Every contender's code as the report hashed it, wherever it is installed."""
        recorded = report["provenance"].get("impl_sources")
        if recorded is None:
            self.check(f"{side} contenders' code unchanged", None, "the report predates per-impl source hashes",
                       doubt=f"{side}: the report does not hash its contenders' code (made by an older harness)")
            return
        changes = provenance.impl_source_changes(recorded, root)
        absent = sorted(n for n, c in changes.items() if c["missing"] and not c["changed"] and
                        len(c["missing"]) == len(recorded[n].get("files", {})))
        bad = {n: c for n, c in changes.items() if n not in absent and any(c.values())}
        if bad:
            self.check(f"{side} contenders' code unchanged", False, changes,
                       fail=f"{side}: contender code differs from the report: {bad}")
        elif absent:
            self.check(f"{side} contenders' code unchanged", None, changes,
                       doubt=f"{side}: the code of {absent} is not installed here to re-check or replay")
        else:
            self.check(f"{side} contenders' code unchanged", True, changes)

    def _replay(self, reports: dict, roots: dict) -> None:
        cand = reports["candidate"]
        config = dict(cand["config"])
        for field, least in (("rounds", verdict.MIN_REPLAY_ROUNDS), ("samples", verdict.MIN_REPLAY_SAMPLES)):
            config[field] = max(getattr(self.options, field) or config[field], least)  # never a point estimate
        control = self._control(reports)
        if control is None:
            return
        names = sorted({c["name"] for c in cand["cases"]} & {c["name"] for c in reports["reference"]["cases"]})
        impls = sorted({c["impl"] for rep in reports.values() for c in rep["cases"]})  # the reference's own too
        if not names:  # an empty pattern would match the whole suite
            self.check("replay", None, "the two reports share no case",
                       doubt="the two reports share no case: nothing to replay or compare")
            return
        request = {"suite": cand["suite"], "config": config, "cases": ",".join(names), "impls": ",".join(impls)}
        extension = Extension(max_rounds=self.options.max_rounds or 3 * config["rounds"],
                              time_limit_s=self.options.time_limit_s)
        if self.options.ray is not None:
            sides = self._replay_on_cluster(reports, roots, request, names, extension)
            if sides is None:
                return
        else:
            try:
                sides = run_sides(roots, request, config["rounds"], progress=self.options.progress, extension=extension)
            except RevisionError as e:
                self.check("replay", False, str(e), fail=f"replay failed: {e}")
                return
        self._check_artifacts(reports, sides, roots)
        self._check_validations(sides)
        for side, rep in reports.items():
            self._check_replayed_impls(side, rep, sides[side])
            self._check_problems(side, rep, sides[side])
            self._check_control_times(side, rep, sides[side]["rounds"], control)
            self.versus += self._versus_control(side, rep, sides[side]["rounds"], control)
        suite = types.SimpleNamespace(name=cand["suite"], device=cand.get("suite_device", "cpu"), control=control)
        for side, rep in reports.items():
            sides[side]["revision"] = {"report": str(self.paths[side]), "commit": rep["provenance"]["git"]["commit"]}
        replay = assemble.comparison_report(suite, config, sides["reference"], sides["candidate"])
        self._judge_claims(reports, replay)
        raw = {side: sides[side]["rounds"] for side in ("reference", "candidate")}
        self.out["replay_stopping"] = sides["candidate"].get("stopping")
        self.out.update({
            "replay_sha256": hashlib.sha256(json.dumps(raw, sort_keys=True, separators=(",", ":"),
                                                       default=str).encode()).hexdigest(),
            "replay_pairs": sum(1 for r in replay["records"] for m in replay["summaries"] if m in r),
            "torch_probe_control_ratio_range": replay["torch_probe_control_ratio_range"],
            "summaries": replay["summaries"],
            "records": replay["records"],
            "replay_config": config,
            "replay_provenance": {side: sides[side]["provenance"] for side in sides},
        })

    def _control(self, reports: dict) -> str | None:
        """The control the replay measures drift with: the one the suite registers (in this environment,
        never read from contender code), which both reports must name; a report naming another would turn
        the drift guard off. Where the suite is not registered here, the name both reports agree on. None
        (recorded as a failure) where they disagree."""
        from kernellab.harness import registry

        named = {side: rep.get("control") for side, rep in reports.items()}
        try:
            registered = registry.get(reports["candidate"]["suite"], impls=False).control
        except Exception:  # noqa: BLE001 - a suite this environment lacks: the reports' own agreement decides
            registered = None
        wanted = registered or named["reference"]
        wrong = {side: name for side, name in named.items() if name != wanted}
        detail = {"registered": registered, **named}
        self.check("both reports name the suite's control", not wrong, detail,
                   fail=f"the reports' control {wrong} is not the suite's {wanted!r}: its drift guard would "
                        "measure another impl or none")
        return None if wrong else wanted

    def _replay_on_cluster(self, reports: dict, roots: dict, request: dict, names: list[str],
                           extension: Extension) -> dict | None:
        """The replay on a Ray cluster, one task per problem, each on a node that has a device of the name
        both reports recorded for that problem's cases; a problem no node can take, or whose task failed,
        is said not to be replayed (and why)."""
        from kernellab.harness import cluster

        try:
            session = cluster.connect(self.options.ray or None)
        except cluster.ClusterError as e:
            self.check("replay", False, str(e), fail=f"replay failed: {e}")
            return None
        try:
            wanted, cannot = {}, {}
            for name in names:
                recorded = {side: recorded_device(rep, name) for side, rep in reports.items()}
                if recorded["reference"] != recorded["candidate"]:
                    cannot[name] = (f"the reports recorded it on different devices ({recorded['reference']} and "
                                    f"{recorded['candidate']}), which one replay cannot match")
                else:
                    wanted[name] = recorded["candidate"]
            found, missing = cluster.nodes_with(wanted, cluster.node_devices(session))
            cannot.update(missing)
            runnable = [n for n in names if n in found]
            if not runnable:
                self.check("each problem replayed on a device of its recorded name", None, cannot,
                           doubt=f"no problem can be replayed on the device its report recorded, first: "
                                 f"{next(iter(cannot.items()))}")
                return None
            expected = {n: [{k: c.get(k) for k in ("id", "problem", "impl", "status", "reason")}
                            for c in reports["candidate"]["cases"] if c["name"] == n] for n in runnable}

            def ran_where_recorded(outcomes: dict) -> None:
                for problem, outcome in outcomes.items():
                    if "result" in outcome:
                        got = outcome["result"]["sides"]["candidate"]["provenance"]["device"].get("name")
                        if got != wanted[problem][1]:
                            outcomes[problem] = {"problem": problem,
                                                 "failed": f"ran on {got!r}, not the recorded {wanted[problem][1]!r}"}

            plan = cluster.Plan(trees=dict(roots), request=request, rounds=request["config"]["rounds"],
                                device=reports["candidate"].get("suite_device", "cpu"), extension=extension,
                                case_timeout_s=self.options.case_timeout_s, nodes_for=found)
            sides = cluster.run_plan(session, plan, runnable, expected,
                                     display=cluster.Display(len(runnable), enabled=self.options.progress),
                                     on_outcomes=ran_where_recorded)
        except cluster.ClusterError as e:
            self.check("replay", False, str(e), fail=f"replay failed: {e}")
            return None
        finally:
            session.close()
        cannot.update(sides["candidate"]["provenance"]["cluster"]["failed_problems"])
        self.check("each problem replayed on a device of its recorded name", None if cannot else True,
                   cannot or {n: f"{kind} {name!r}" for n, (kind, name) in wanted.items()},
                   doubt=f"{len(cannot)} problem(s) not replayed on the device their report recorded, first: "
                         f"{next(iter(cannot.items()))}" if cannot else None)
        return sides

    def _check_problems(self, side: str, report: dict, replayed: dict) -> None:
        """Each case's problem as the report records it is the one the replay's suite describes (its shape, dtype,
        bytes, ...): a report whose problem bytes were inflated claims a bandwidth, and a fraction of the copy
        ceiling, that its times do not give."""
        described = {c["id"]: c.get("problem") or {} for c in replayed["cases"]}
        differ = {}
        for case in report["cases"]:
            theirs = described.get(case["id"])
            ours = case.get("problem") or {}
            if theirs is not None:
                changed = {k: [ours[k], theirs[k]] for k in ours.keys() & theirs.keys() if ours[k] != theirs[k]}
                if changed:
                    differ[case["id"]] = changed
        self.check(f"{side} problems as the suite describes them", not differ, differ or "every case's problem",
                   fail=f"{side}: {len(differ)} case(s) record a problem the suite describes otherwise, first: "
                        f"{next(iter(differ.items()))}" if differ else None)

    def _check_control_times(self, side: str, report: dict, rounds: list[dict], control: str) -> None:
        """The report's absolute times, through its control's (``verdict.control_times``): where they are not the
        replay's, its microseconds, GB/s and fractions of the copy are unconfirmed, and the verdict inconclusive
        (a machine busier or quieter at the report's time than at the replay's looks the same as a forgery)."""
        if self.foreign_device:
            return  # another device's times cannot be judged here: already a doubt
        off = verdict.control_times(report, rounds, control)
        self.check(f"{side} control times reproduced", None if off else True, off or "every control case",
                   doubt=f"{side}: {len(off)} control time(s) further than {verdict.CONTROL_TIME_LIMIT}x from every "
                         f"replayed round, so its absolute times (us, GB/s, of copy) are unconfirmed, first: {off[0]}"
                   if off else None)

    def _check_replayed_impls(self, side: str, report: dict, replayed: dict) -> None:
        """Every case a report measured is measured by the replay, or the verdict says why not (a case the replay's
        worker offered but never measured: one only that report's tree has, which the two sides do not run in
        common)."""
        ran = {c["id"]: c for c in replayed["cases"]}
        measured = {cid for r in replayed["rounds"] for cid, data in r.items() if data.get("samples_us")}
        missing = []
        for case in report["cases"]:
            got = ran.get(case["id"])
            if case["status"] in ("ok", "failed") and (got is None or got["status"] != "ok"):
                why = "not offered by the replay's suite" if got is None else f"{got['status']}: {got.get('reason')}"
                missing.append(f"{case['id']} ({why})")
            elif case["status"] == "ok" and case["id"] not in measured:
                missing.append(f"{case['id']} (offered, never measured: not a case of both revisions)")
        self.check(f"every case the {side} measured replayed", None if missing else True, missing,
                   doubt=f"{len(missing)} case(s) the {side} measured not replayed, first: {missing[0]}"
                   if missing else None)

    def _check_artifacts(self, reports: dict, sides: dict, roots: dict) -> None:
        unchanged, checked = 0, True
        for side, rep in reports.items():
            recorded = rep["provenance"].get("artifacts_sha256", {})
            current = sides[side]["provenance"].get("artifacts_sha256", {})
            changes = trees.artifact_changes(recorded, current, rep["provenance"].get("git", {}).get("root"),
                                             str(roots[side]))
            unchanged += len(changes["unchanged"])
            checked &= not changes["unchecked"]
            if changes["changed"]:
                self.check(f"{side} artifacts match the report", False, changes,
                           fail=f"{side}: built artifacts differ from the report: {changes['changed']}")
            elif changes["unchecked"]:
                self.check(f"{side} artifacts match the report", None, changes,
                           doubt=f"{side}: recorded artifacts not present to re-hash: {changes['unchecked']}")
            else:
                self.check(f"{side} artifacts match the report", True, changes)
        self.out["recorded_unchanged_artifacts"] = unchanged
        self.out["current_artifacts_checked"] = checked

    def _check_validations(self, sides: dict) -> None:
        """Every replayed validation must pass. Those the driver made again from shipped results (``external``)
        are counted apart, and a case none of whose results the driver could check (each over the harness's
        ship limit) is named: its outputs were judged only inside the process that ran the contender."""
        executed, by_driver, failed, worker_only = 0, 0, [], set()
        for side, data in sides.items():
            for r, cases in enumerate(data["rounds"]):
                for cid, result in cases.items():
                    checks = list(result.get("validations", []))
                    if "graph_replay" in result:
                        checks.append(result["graph_replay"])
                    executed += len(checks)
                    external = sum(1 for v in checks if v.get("external"))
                    by_driver += external
                    if checks and not external:
                        worker_only.add(f"{side} {cid}")
                    for v in checks:
                        if not v.get("passed"):
                            failed.append(f"{side} {cid} round {r + 1}: {_why(v)}")
                    if result.get("error"):
                        failed.append(f"{side} {cid} round {r + 1}: {result['error']}")
        self.out["executed_output_validations"] = executed
        self.out["output_validations_by_driver"] = by_driver
        self.out["validated_in_worker_only"] = sorted(worker_only)
        self.check("output validations", not failed,
                   {"executed": executed, "by_driver": by_driver, "worker_only": sorted(worker_only),
                    "failed": failed},
                   fail=f"{len(failed)} validation(s) failed, first: {failed[0]}" if failed else None)

    def _versus_control(self, side: str, report: dict, rounds: list[dict],
                        control: str) -> list[tuple[dict, dict | None]]:
        """A report's claims against its control, each with the replay's record of the same pair on that report's
        side (None where the replay did not measure both): judged with the A/B claims (``_judge_claims``)."""
        out = []
        for (label, mode), claim in sorted(verdict.versus_control_claims(report).items()):
            name, impl = label.split(" versus ")[0].rsplit("/", 1)
            rec = verdict.replay_versus_control(rounds, f"{name}/{impl}", f"{name}/{control}", mode)
            out.append(({**claim, "label": f"{side}: {label}", "mode": mode}, rec))
        return out

    def _judge_claims(self, reports: dict, replay: dict) -> None:
        claimed = verdict.claims(reports["reference"], reports["candidate"])
        outcomes = {verdict.REPRODUCED: [], verdict.CONTRADICTED: [], verdict.UNDECIDED: []}
        judged_versus = []
        for claim, rec in self.versus:
            if rec is None:
                outcomes[verdict.UNDECIDED].append(f"{claim['label']} {claim['mode']}: claimed "
                                                   f"{claim['claimed_gain']:.3f}, not replayed")
                continue
            judged = verdict.judge(claim, rec, self.options.tolerance)
            judged_versus.append({**judged, "replayed_gain": rec["gain"], "replayed_ci": rec["gain_ci"]})
            outcomes[judged["claim"]].append(_outcome(f"{claim['label']} {claim['mode']}", judged, rec["gain"],
                                                      "x the control's speed"))
        self.out["versus_control_claims"] = judged_versus
        for rec in replay["records"]:
            for mode in replay["summaries"]:
                if mode in rec and (rec["name"], mode) in claimed:
                    # noise on the replay's control (either side) moves its drift guard and the normalized gain
                    noisy = {"disturbed": True} if gate.control_disturbed(replay, rec, mode) else {}
                    judged = verdict.judge(claimed[(rec["name"], mode)], rec[mode] | noisy, self.options.tolerance)
                    rec[mode].update(judged)
                    outcomes[judged["claim"]].append(_outcome(f"{rec['name']} {mode}", judged, rec[mode]["gain"]))
        replayed = {(rec["name"], mode) for rec in replay["records"] for mode in replay["summaries"] if mode in rec}
        for name, mode in sorted(set(claimed) - replayed):
            outcomes[verdict.UNDECIDED].append(f"{name} {mode}: claimed {claimed[(name, mode)]['claimed_gain']:.3f}, "
                                               "not replayed")
        detail = {k: v for k, v in outcomes.items()}
        if outcomes[verdict.CONTRADICTED] and not self.foreign_device:
            self.check("claims reproduced", False, detail,
                       fail=f"{len(outcomes[verdict.CONTRADICTED])} claim(s) contradicted by the replay, first: "
                            f"{outcomes[verdict.CONTRADICTED][0]}")
        elif outcomes[verdict.CONTRADICTED]:
            self.check("claims reproduced", None, detail,
                       doubt=f"{len(outcomes[verdict.CONTRADICTED])} claim(s) differ from a replay on another "
                             f"device than the report's, first: {outcomes[verdict.CONTRADICTED][0]}")
        elif outcomes[verdict.UNDECIDED]:
            self.check("claims reproduced", None, detail,
                       doubt=f"{len(outcomes[verdict.UNDECIDED])} claim(s) undecided (the replay could not decide: "
                             f"interval wider than {verdict.INFORMATIVE_WIDTH}x, drift, disturbance, or no replay), "
                             f"first: {outcomes[verdict.UNDECIDED][0]}")
        elif not outcomes[verdict.REPRODUCED]:
            self.check("claims reproduced", None, detail,
                       doubt="no (case, mode) pair is in both reports and the replay, so no claim could be checked")
        else:
            self.check("claims reproduced", True, detail)

    def _finish(self) -> dict:
        status = FAIL if self.failures else INCONCLUSIVE if self.doubts else PASS
        self.out.update(status=status, reasons=self.failures + self.doubts, checks=self.checks,
                        created_at=assemble.now_iso(), tolerance=self.options.tolerance,
                        rules={"informative_width": verdict.INFORMATIVE_WIDTH, "decisive_width": verdict.DECISIVE_WIDTH,
                               "drift_limit": verdict.DRIFT_LIMIT})
        self.out[HASH_FIELD] = report_io.report_hash(self.out, HASH_FIELD)
        return self.out


def _outcome(what: str, judged: dict, replayed_gain: float, unit: str = "") -> str:
    """One judged claim as the verdict's reasons list it: claimed, replayed, the band, the noise and why not."""
    band = judged["replay_band"]
    return (f"{what}: claimed {judged['claimed_gain']:.3f}{unit}, replayed {replayed_gain:.3f} (band "
            f"{band[0]:.3g}-{band[1]:.3g}; the reports' own noise {judged['claim_noise']:.3g}x"
            + "".join(f"; {why}" for why in judged["uninformative_because"] + judged["change_not_shown"]) + ")")


def integrity(report: dict, trusted: dict | None) -> list[tuple[str, bool | None, str]]:
    """(check, passed, detail) of what a report shows without a replay: every derived number against its
    raw data, and its signature (verified against ``trusted`` keys; None: a signature is only noted)."""
    found = consistency.check(report)
    shown = "; ".join(map(str, found[:INCONSISTENCIES_SHOWN]))
    more = f"; and {len(found) - INCONSISTENCIES_SHOWN} more" if len(found) > INCONSISTENCIES_SHOWN else ""
    out = [("internally consistent", not found,
            f"inconsistent: {shown}{more}" if found else "every derived number matches its raw data")]
    if trusted is not None:
        try:
            out.append(("signature", True, f"signed by trusted key {signing.verify(report, trusted)}"))
        except signing.SigningError as e:
            out.append(("signature", False, str(e)))
    elif signing.signer(report):
        out.append(("signature", None, f"signed by key {signing.signer(report)}, not verified (no trusted keys)"))
    return out


def recorded_device(report: dict, problem: str) -> tuple[str, str]:
    """(kind, name) of the device a report measured ``problem`` on: its cases' own (a cluster run's),
    else the report's."""
    for case in report["cases"]:
        if case["name"] == problem and isinstance(case.get("device"), dict):
            return case["device"].get("kind"), case["device"].get("name")
    device = (report.get("provenance") or {}).get("device") or {}
    return device.get("kind") or report.get("suite_device", "cpu"), device.get("name")


def device_mismatch(report: dict) -> str | None:
    """Why a report's timings were not made on this machine, or None where its device is this one."""
    kind = ((report.get("provenance") or {}).get("device") or {}).get("kind") or report.get("suite_device", "cpu")
    try:
        here = provenance.device_info(kind)
    except Exception as e:  # noqa: BLE001 - no such device here (no CUDA): that is the mismatch
        return f"was made on a {kind} device; this machine cannot describe one ({type(e).__name__}: {e})"
    return consistency.check_device(report, here)


def _why(v: dict) -> str:
    if v.get("error"):
        return v["error"]
    bad = {k: o for k, o in v.get("outputs", {}).items() if not o.get("passed")}
    return "; ".join(f"{k}: {o.get('violations', '?')} of {o.get('elements', '?')} elements wrong "
                     f"({o.get('unwritten_or_nan', 0)} unwritten or NaN)" for k, o in bad.items()) or "failed"
