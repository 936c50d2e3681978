"""The client: one channel, one method per RPC, events as a generator."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence

import grpc

from ._generated import agent_pb2 as pb
from ._generated import agent_pb2_grpc as pb_grpc

FINISHED = {pb.JOB_STATUS_SUCCEEDED, pb.JOB_STATUS_FAILED, pb.JOB_STATUS_CANCELLED}


@dataclass(frozen=True)
class Submitted:
    """What SubmitJob answered."""

    job_id: str
    # True when the idempotency key matched an earlier submission: this is its job.
    duplicate: bool


@dataclass(frozen=True)
class Event:
    """One entry of a job's event log."""

    job_id: str
    offset: int
    # job_queued, job_started, model_turn, tool_call_dispatched,
    # tool_call_progress, tool_unavailable, tool_call_result, job_succeeded, job_failed,
    # job_cancelled, ... (docs/api.md, "Events"); and model_output_delta,
    # a streamed job's answer as it is written, not stored
    kind: str
    # The event's details, parsed from JSON.
    data: Any
    timestamp_ms: int
    # The job's last event: the stream ends after it.
    final: bool


class JobFailed(Exception):
    """A job ended failed or cancelled (raised by `Client.run`)."""

    def __init__(self, job: pb.Job):
        self.job = job
        status = pb.JobStatus.Name(job.status)
        super().__init__(f"job {job.job_id} ended {status}: {job.error.code} {job.error.message}")


def _channel(
    address: str, ca_file: Optional[str], cert_file: Optional[str], key_file: Optional[str]
) -> grpc.Channel:
    """A channel to `address`: plaintext, or TLS with an `https://` address
    or any TLS file."""
    tls = address.startswith("https://") or any((ca_file, cert_file, key_file))
    target = address.removeprefix("https://").removeprefix("http://")
    if not tls:
        return grpc.insecure_channel(target)
    if bool(cert_file) != bool(key_file):
        raise ValueError("a client certificate needs its key: give tls_cert_file and tls_key_file")

    def read(path: Optional[str]) -> Optional[bytes]:
        if path is None:
            return None
        with open(path, "rb") as file:
            return file.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(ca_file),
        private_key=read(key_file),
        certificate_chain=read(cert_file),
    )
    return grpc.secure_channel(target, credentials)


class Client:
    """A client of one orchestrator (any replica).

    `address` is `host:port` (plaintext), `https://host:port` (TLS), or a
    `grpc.Channel` of your own (interceptors, other credentials). `timeout`
    bounds each unary call, in seconds. `token` is your tenant's API token
    (default: the TOOLFLEET_TOKEN environment variable), sent as
    `authorization: Bearer <token>`.

    TLS, as the `toolfleet` CLI takes it: `tls_ca_file` is the CA (PEM) the
    orchestrator's certificate chains to (default: the system's roots);
    `tls_cert_file` and `tls_key_file` are a client certificate and its key
    (PEM), for an orchestrator that requires mutual TLS. Each defaults to
    TOOLFLEET_TLS_CA_FILE, TOOLFLEET_TLS_CERT_FILE and TOOLFLEET_TLS_KEY_FILE.
    Any of them, or an `https://` address, makes the channel TLS.
    """

    def __init__(
        self,
        address: "str | grpc.Channel",
        timeout: float = 10.0,
        token: Optional[str] = None,
        *,
        tls_ca_file: Optional[str] = None,
        tls_cert_file: Optional[str] = None,
        tls_key_file: Optional[str] = None,
    ):
        self._own_channel = isinstance(address, str)
        if isinstance(address, str):
            self._channel = _channel(
                address,
                tls_ca_file or os.environ.get("TOOLFLEET_TLS_CA_FILE"),
                tls_cert_file or os.environ.get("TOOLFLEET_TLS_CERT_FILE"),
                tls_key_file or os.environ.get("TOOLFLEET_TLS_KEY_FILE"),
            )
        else:
            self._channel = address
        self._stub = pb_grpc.AgentServiceStub(self._channel)
        self._timeout = timeout
        # The tenant's API token (default: $TOOLFLEET_TOKEN), sent with every call.
        token = token if token is not None else os.environ.get("TOOLFLEET_TOKEN")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel, if this client opened it."""
        if self._own_channel:
            self._channel.close()

    def submit(
        self,
        input: str,
        *,
        script: Optional[Sequence[Mapping[str, Any]] | str] = None,
        provider: str = "",
        model: str = "",
        instructions: str = "",
        tools: Sequence[str] = (),
        metadata: Optional[Mapping[str, str]] = None,
        idempotency_key: str = "",
        max_tool_rounds: int = 0,
        deadline_ms: int = 0,
        parallel_tool_calls: Optional[bool] = None,
        require_approval: Sequence[str] = (),
        on_unknown_outcome: str = "",
        max_tokens: int = 0,
        stream: Optional[bool] = None,
    ) -> Submitted:
        """Submits an agent job.

        With `script` (a list of turns, or its JSON text) the scripted model
        plays it; with `provider` ("openai-responses", "openai-chat") and
        `model`, a real model runs; with neither, the orchestrator's
        `api.default_model`. `tools` limits the job to those tools;
        `require_approval` holds every call of those tools ("*": all) until
        a person decides it (`approve`, `reject`; docs/approvals.md);
        `on_unknown_outcome="ask"` holds a call whose outcome no worker could
        tell for an operator's verdict (`resolve`). `max_tokens` bounds what
        the model writes in one turn (0: the provider's default). With
        `stream=True` (unset: the tenant's default), `watch` also yields the model's answer as it is
        written: `model_output_delta` events (`data["text"]`, or
        `data["tool_call"]`; `data["restarted"]` voids what came of the
        turn), never stored, before the turn's `model_turn`
        (docs/api.md, "Streaming").
        """
        spec = pb.ModelSpec(provider=provider, name=model, max_tokens=max_tokens)
        if script is not None:
            spec.provider = provider or "scripted"
            spec.script = script if isinstance(script, str) else json.dumps(script)
        request = pb.SubmitJobRequest(
            input=input,
            instructions=instructions,
            tools=list(tools),
            metadata=dict(metadata or {}),
            idempotency_key=idempotency_key,
            max_tool_rounds=max_tool_rounds,
            deadline_ms=deadline_ms,
            require_approval=list(require_approval),
            on_unknown_outcome=on_unknown_outcome,
        )
        if stream is not None:
            request.stream = stream
        if spec.provider or spec.name or spec.script or spec.max_tokens:
            request.model.CopyFrom(spec)
        if parallel_tool_calls is not None:
            request.parallel_tool_calls = parallel_tool_calls
        response = self._stub.SubmitJob(request, timeout=self._timeout, metadata=self._metadata)
        return Submitted(job_id=response.job_id, duplicate=response.duplicate)

    def get(self, job_id: str) -> pb.Job:
        """The job: status, output, error, the whole conversation, and its
        `submitter` (who submitted it, from the credential: docs/security.md,
        "Who submitted a job")."""
        return self._stub.GetJob(
            pb.GetJobRequest(job_id=job_id), timeout=self._timeout, metadata=self._metadata
        )

    def watch(self, job_id: str, from_offset: int = 0) -> Iterator[Event]:
        """The job's events from `from_offset` on, as they happen, ending with
        its final event (also when `from_offset` is past it)."""
        stream = self._stub.WatchJob(
            pb.WatchJobRequest(job_id=job_id, from_offset=from_offset), metadata=self._metadata
        )
        try:
            for event in stream:
                try:
                    data = json.loads(event.data) if event.data else {}
                except ValueError:
                    data = event.data
                yield Event(
                    job_id=event.job_id,
                    offset=event.offset,
                    kind=event.kind,
                    data=data,
                    timestamp_ms=event.timestamp_ms,
                    final=event.final,
                )
        finally:
            stream.cancel()

    def cancel(self, job_id: str) -> int:
        """Asks the job to stop; returns its status when asked (a JobStatus)."""
        response = self._stub.CancelJob(
            pb.CancelJobRequest(job_id=job_id), timeout=self._timeout, metadata=self._metadata
        )
        return response.status

    def list_jobs(
        self,
        *,
        page_size: int = 0,
        page_token: str = "",
        status: int = pb.JOB_STATUS_UNSPECIFIED,
        metadata: Optional[Mapping[str, str]] = None,
        created_after_ms: int = 0,
        created_before_ms: int = 0,
        with_counts: bool = False,
    ) -> pb.ListJobsResponse:
        """A page of your jobs, newest first (without their items): your
        tenant's to an operator or a reader, those it submitted to any other
        agent. `created_after_ms` (included) and `created_before_ms`
        (excluded) bound when they were created, in Unix ms; 0 is no
        bound. With `with_counts`, the answer's `counts` say how many of
        the jobs you see are in each status, whatever the filters."""
        request = pb.ListJobsRequest(
            page_size=page_size,
            page_token=page_token,
            status=status,
            metadata=dict(metadata or {}),
            created_after_ms=created_after_ms,
            created_before_ms=created_before_ms,
            with_counts=with_counts,
        )
        return self._stub.ListJobs(request, timeout=self._timeout, metadata=self._metadata)

    def list_tools(self, *, include_unavailable: bool = False) -> Sequence[pb.Tool]:
        """The tools that live workers serve. To an operator or a reader,
        with the fleet's details (`pools`, `calls_waiting`,
        `workers_unavailable`, `mcp_server`) and, with
        `include_unavailable`, the tools no live worker can run now
        (`available` false); others get those fields empty. Everyone gets
        each tool's circuit breaker (`breaker`: "closed", "open" or
        "half_open", and `breaker_since_ms`)."""
        request = pb.ListToolsRequest(include_unavailable=include_unavailable)
        return self._stub.ListTools(request, timeout=self._timeout, metadata=self._metadata).tools

    def who_am_i(self) -> pb.WhoAmIResponse:
        """Who the orchestrator takes your credential for: `tenant`,
        `person` (empty when the tokens file names none) and `roles`."""
        return self._stub.WhoAmI(pb.WhoAmIRequest(), timeout=self._timeout, metadata=self._metadata)

    def pending_approvals(self, *, page_size: int = 0, page_token: str = "") -> pb.ListPendingApprovalsResponse:
        """A page of the calls of your jobs that wait for a decision, oldest
        first."""
        request = pb.ListPendingApprovalsRequest(page_size=page_size, page_token=page_token)
        return self._stub.ListPendingApprovals(request, timeout=self._timeout, metadata=self._metadata)

    def approve(
        self, job_id: str, call_id: str, *, reason: str = "", arguments: Optional[Mapping[str, Any] | str] = None
    ) -> int:
        """Approves a held call: it runs, with `arguments` (a dict, or its JSON
        text) instead of the model's if given. Returns the job's status. A
        call is decided once: a second decision raises FAILED_PRECONDITION."""
        request = pb.DecideCallRequest(
            job_id=job_id, call_id=call_id, decision=pb.DECISION_APPROVE, reason=reason
        )
        if arguments is not None:
            request.arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return self._stub.DecideCall(request, timeout=self._timeout, metadata=self._metadata).status

    def reject(self, job_id: str, call_id: str, reason: str) -> int:
        """Rejects a held call: the model gets REJECTED_BY_APPROVER and the
        reason. Returns the job's status."""
        request = pb.DecideCallRequest(
            job_id=job_id, call_id=call_id, decision=pb.DECISION_REJECT, reason=reason
        )
        return self._stub.DecideCall(request, timeout=self._timeout, metadata=self._metadata).status

    def resolve(
        self,
        job_id: str,
        call_id: str,
        verdict: str,
        *,
        result: Any = None,
        reason: str = "",
    ) -> int:
        """Gives an operator's verdict on a call whose outcome no worker could
        tell (a job submitted with on_unknown_outcome="ask"): "applied" (the
        model gets `result`, any JSON value, as the call's data),
        "not_applied" (the call runs again) or "fail" (the model gets
        FAILED_BY_OPERATOR and `reason`, required). Returns the job's status."""
        decisions = {
            "applied": pb.DECISION_APPLIED,
            "not_applied": pb.DECISION_NOT_APPLIED,
            "fail": pb.DECISION_FAIL,
        }
        if verdict not in decisions:
            raise ValueError(f"verdict must be one of {sorted(decisions)}, not {verdict!r}")
        request = pb.DecideCallRequest(
            job_id=job_id, call_id=call_id, decision=decisions[verdict], reason=reason
        )
        if result is not None:
            request.result = json.dumps(result)
        return self._stub.DecideCall(request, timeout=self._timeout, metadata=self._metadata).status

    def call(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        metadata: Optional[Mapping[str, str]] = None,
        idempotency_key: str = "",
        deadline_ms: int = 0,
    ) -> Any:
        """Runs one tool call through the fleet without a model (a call job,
        docs/api.md) and returns its envelope, as the model would see it:
        `{"ok": True, "data": ...}` or `{"ok": False, "error": {...}}`.
        Raises JobFailed when the job itself failed (a deadline) or was
        cancelled."""
        request = pb.SubmitJobRequest(
            call=pb.ToolCallRequest(tool=tool, arguments=json.dumps(dict(arguments or {}))),
            metadata=dict(metadata or {}),
            idempotency_key=idempotency_key,
            deadline_ms=deadline_ms,
        )
        response = self._stub.SubmitJob(request, timeout=self._timeout, metadata=self._metadata)
        for event in self.watch(response.job_id):
            if event.final:
                break
        job = self.get(response.job_id)
        if job.status != pb.JOB_STATUS_SUCCEEDED:
            raise JobFailed(job)
        return json.loads(job.output_text)

    def run(self, input: str, **submit: Any) -> pb.Job:
        """Submits, waits for the end, and returns the job; raises JobFailed
        when it failed or was cancelled."""
        job_id = self.submit(input, **submit).job_id
        for event in self.watch(job_id):
            if event.final:
                break
        job = self.get(job_id)
        if job.status != pb.JOB_STATUS_SUCCEEDED:
            raise JobFailed(job)
        return job
