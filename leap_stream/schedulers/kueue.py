"""Kueue: an admission gate that puts a job on its top-ranked hardware types before it starts.

**Untested against a live cluster** (no API server runs where leap-stream is tested): the
decision (`submission_of`, `decide`) is pure and unit-tested; the controller around it
(`GateController`, `KubeAPI`) is a thin loop over the Kubernetes REST API, tested only against
an in-memory stand-in. docs/schedulers.md gives the flow and deploy/k8s/kueue the manifests.

The flow: a user creates a Job with
- the label ``leap-stream.io/rank: "true"`` (so the controller can select it),
- the annotation ``kueue.x-k8s.io/admission-gated-by: leap-stream.io/ranker`` (Kueue holds the
  job's admission while a gate is listed),
- the annotation ``leap-stream.io/job-spec`` (the job spec as JSON, contracts/job_spec.py) and
  ``leap-stream.io/allowed-types`` (comma-separated catalog type ids).
The controller ranks it through `leap-stream serve`, sets the pod template's required node
affinity to the top-k allowed types (on the node label ``leap-stream.io/hardware-type``, ANDed
into every existing term), records the decision in ``leap-stream.io/decision`` and removes its
name from the gate annotation, so Kueue admits the job. With no ranking it only removes the gate:
a job is never held for leap-stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

import orjson

from leap_stream.contracts.job_spec import JobSpecError, submission_from_spec
from leap_stream.core.placement import choose

log = logging.getLogger(__name__)

GATE_ANNOTATION = "kueue.x-k8s.io/admission-gated-by"
GATE_NAME = "leap-stream.io/ranker"
SPEC_ANNOTATION = "leap-stream.io/job-spec"
ALLOWED_ANNOTATION = "leap-stream.io/allowed-types"
DECISION_ANNOTATION = "leap-stream.io/decision"
SELECT_LABEL = "leap-stream.io/rank"
NODE_LABEL = "leap-stream.io/hardware-type"


def gates(job: Mapping[str, Any]) -> list[str]:
    raw = (job.get("metadata", {}).get("annotations") or {}).get(GATE_ANNOTATION, "")
    return [g.strip() for g in str(raw).split(",") if g.strip()]


def gated(job: Mapping[str, Any]) -> bool:
    """Whether the job still waits for this gate."""
    return GATE_NAME in gates(job)


def allowed_types(job: Mapping[str, Any]) -> list[str]:
    """The hardware types the Job's ``leap-stream.io/allowed-types`` annotation allows."""
    raw = (job.get("metadata", {}).get("annotations") or {}).get(ALLOWED_ANNOTATION, "")
    return [t.strip() for t in str(raw).split(",") if t.strip()]


def submission_of(job: Mapping[str, Any], now: datetime) -> dict[str, Any] | str:
    """The job-submitted event of a gated Job, or why it cannot be ranked."""
    meta = job.get("metadata", {})
    annotations = meta.get("annotations") or {}
    allowed = allowed_types(job)
    if not allowed:
        return f"no {ALLOWED_ANNOTATION} annotation"
    try:
        spec = orjson.loads(annotations.get(SPEC_ANNOTATION, ""))
        job_id = f"k8s/{meta['namespace']}/{meta['name']}/{str(meta.get('uid', ''))[:8]}"
        return submission_from_spec(spec, job_id=job_id, allowed=allowed, now=now)
    except (orjson.JSONDecodeError, JobSpecError, KeyError) as exc:
        return f"job spec: {exc}"


def _with_types(
    affinity: Mapping[str, Any] | None, key: str, types: Sequence[str]
) -> dict[str, Any]:
    """``affinity`` with ``key In types`` required on every node selector term (a new term when
    there is none): Kubernetes ORs the terms, so the condition must be in each."""
    out = dict(affinity or {})
    node = dict(out.get("nodeAffinity") or {})
    required = dict(node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or []] or [{}]
    expression = {"key": key, "operator": "In", "values": list(types)}
    for term in terms:
        kept = [e for e in term.get("matchExpressions") or [] if e.get("key") != key]
        term["matchExpressions"] = [*kept, expression]
    required["nodeSelectorTerms"] = terms
    node["requiredDuringSchedulingIgnoredDuringExecution"] = required
    out["nodeAffinity"] = node
    return out


def decide(
    job: Mapping[str, Any],
    ranking: Mapping[str, Any] | None,
    *,
    k: int = 1,
    node_label: str = NODE_LABEL,
    why: str = "",
) -> dict[str, Any]:
    """The JSON merge patch that releases the job: the gate removed, the decision recorded,
    and, when the ranking ranks any allowed type, the node affinity set to the top ``k``."""
    top = choose(ranking, set(allowed_types(job)), k)
    others = [g for g in gates(job) if g != GATE_NAME]
    if top and ranking is not None:
        decision = f"types={','.join(top)};ranking={ranking['job_id']};source={ranking['source']}"
    else:
        decision = f"unranked;{why or 'no allowed type ranked'}"
    patch: dict[str, Any] = {
        "metadata": {
            "annotations": {
                GATE_ANNOTATION: ",".join(others) if others else None,
                DECISION_ANNOTATION: decision,
            }
        }
    }
    if top:
        pod = job["spec"]["template"]["spec"]
        affinity = _with_types(pod.get("affinity"), node_label, top)
        patch["spec"] = {"template": {"spec": {"affinity": affinity}}}
    return patch


class JobsAPI(Protocol):
    def list_jobs(self, label_selector: str) -> list[dict[str, Any]]: ...

    def patch_job(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None: ...


class GateController:
    """Releases every gated job once: rank, decide, patch. A failed ranking still releases."""

    def __init__(
        self,
        api: JobsAPI,
        rank: Callable[[bytes], Mapping[str, Any]],
        *,
        k: int = 1,
        node_label: str = NODE_LABEL,
        clock: Callable[[], datetime],
    ) -> None:
        self.api = api
        self.rank = rank
        self.k = k
        self.node_label = node_label
        self.clock = clock
        self.released = 0

    def run_once(self) -> int:
        done = 0
        for job in self.api.list_jobs(f"{SELECT_LABEL}=true"):
            if not gated(job):
                continue
            ranking, why = self._ranking(job)
            patch = decide(job, ranking, k=self.k, node_label=self.node_label, why=why)
            meta = job["metadata"]
            self.api.patch_job(meta["namespace"], meta["name"], patch)
            done += 1
        self.released += done
        return done

    def _ranking(self, job: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, str]:
        submission = submission_of(job, self.clock())
        if isinstance(submission, str):
            return None, submission
        try:
            out = self.rank(orjson.dumps(submission))
        except Exception as exc:  # the serve is down: release the job as it is
            return None, f"rank failed: {exc!r}"
        if "error" in out:
            return None, f"rank refused: {out['error'].get('kind')}"
        return out, ""


class KubeAPI:
    """The two calls the controller makes, over the API server's REST interface, with the
    pod's service account (in-cluster)."""

    SA = "/var/run/secrets/kubernetes.io/serviceaccount"

    def __init__(self, base_url: str, token: str, ca_file: str | bool = True) -> None:
        import httpx

        self._http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, verify=ca_file
        )

    @classmethod
    def in_cluster(cls) -> KubeAPI:
        import os
        from pathlib import Path

        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        token = Path(cls.SA, "token").read_text().strip()
        return cls(f"https://{host}:{port}", token, f"{cls.SA}/ca.crt")

    def list_jobs(self, label_selector: str) -> list[dict[str, Any]]:
        resp = self._http.get("/apis/batch/v1/jobs", params={"labelSelector": label_selector})
        resp.raise_for_status()
        items: list[dict[str, Any]] = resp.json()["items"]
        return items

    def patch_job(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        resp = self._http.patch(
            f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
            content=orjson.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        resp.raise_for_status()


def serve_ranker(url: str, token: str | None, timeout_s: float) -> Callable[[bytes], Any]:
    """Ranks one submission with `leap-stream serve` at ``url`` (…/v1/rank)."""
    import httpx

    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    client = httpx.Client(timeout=timeout_s, headers=headers)

    def rank(submission: bytes) -> Any:
        resp = client.post(url, content=submission)
        if resp.status_code not in (200, 422):
            resp.raise_for_status()
        return resp.json()

    return rank


def run_forever(controller: GateController, poll_s: float) -> None:
    while True:
        try:
            controller.run_once()
        except Exception as exc:
            log.warning("kueue gate: %r", exc)
        time.sleep(poll_s)


def register(parser: Any) -> None:
    parser.add_argument("--serve-url", required=True, help="leap-stream serve's /v1/rank URL")
    parser.add_argument("--token-file", default=None, help="a file with the bearer token")
    parser.add_argument("--k", type=int, default=1, help="how many top types the job may use")
    parser.add_argument("--node-label", default=NODE_LABEL, help="the nodes' hardware-type label")
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between passes")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="ranking timeout")


def run(args: Any, cfg: Any) -> int:
    from datetime import UTC
    from pathlib import Path

    logging.basicConfig(level=cfg.log_level, format="%(asctime)s %(levelname)s %(message)s")
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    controller = GateController(
        KubeAPI.in_cluster(),
        serve_ranker(args.serve_url, token, args.timeout_s),
        k=args.k,
        node_label=args.node_label,
        clock=lambda: datetime.now(UTC),
    )
    log.warning("kueue gate: untested against a live cluster (docs/schedulers.md)")
    try:
        run_forever(controller, args.poll_s)
    except KeyboardInterrupt:
        return 0
    return 0


__all__ = [
    "ALLOWED_ANNOTATION",
    "DECISION_ANNOTATION",
    "GATE_ANNOTATION",
    "GATE_NAME",
    "NODE_LABEL",
    "SELECT_LABEL",
    "SPEC_ANNOTATION",
    "GateController",
    "JobsAPI",
    "KubeAPI",
    "allowed_types",
    "decide",
    "gated",
    "gates",
    "register",
    "run",
    "run_forever",
    "serve_ranker",
    "submission_of",
]
