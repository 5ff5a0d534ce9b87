from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProtocolVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROTOCOL_VERSION_UNSPECIFIED: _ClassVar[ProtocolVersion]
    PROTOCOL_VERSION_1: _ClassVar[ProtocolVersion]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_SUCCEEDED: _ClassVar[Outcome]
    OUTCOME_FAILED: _ClassVar[Outcome]
    OUTCOME_TIMED_OUT: _ClassVar[Outcome]
    OUTCOME_CANCELLED: _ClassVar[Outcome]
    OUTCOME_LOST: _ClassVar[Outcome]
PROTOCOL_VERSION_UNSPECIFIED: ProtocolVersion
PROTOCOL_VERSION_1: ProtocolVersion
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_SUCCEEDED: Outcome
OUTCOME_FAILED: Outcome
OUTCOME_TIMED_OUT: Outcome
OUTCOME_CANCELLED: Outcome
OUTCOME_LOST: Outcome

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "heartbeat", "started", "report", "output")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    started: Started
    report: Report
    output: Output
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., started: _Optional[_Union[Started, _Mapping]] = ..., report: _Optional[_Union[Report, _Mapping]] = ..., output: _Optional[_Union[Output, _Mapping]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("welcome", "not_leader", "assign", "cancel", "ack", "abort")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    NOT_LEADER_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    not_leader: NotLeader
    assign: Assign
    cancel: Cancel
    ack: Ack
    abort: Abort
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., not_leader: _Optional[_Union[NotLeader, _Mapping]] = ..., assign: _Optional[_Union[Assign, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., abort: _Optional[_Union[Abort, _Mapping]] = ...) -> None: ...

class AttemptRef(_message.Message):
    __slots__ = ("run_id", "attempt")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt: int
    def __init__(self, run_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("worker_id", "labels", "capacity", "executors", "handlers", "running", "protocol_version", "prefetch")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    HANDLERS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    labels: _containers.ScalarMap[str, str]
    capacity: int
    executors: _containers.RepeatedScalarFieldContainer[str]
    handlers: _containers.RepeatedScalarFieldContainer[str]
    running: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    protocol_version: int
    prefetch: int
    def __init__(self, worker_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., capacity: _Optional[int] = ..., executors: _Optional[_Iterable[str]] = ..., handlers: _Optional[_Iterable[str]] = ..., running: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ..., protocol_version: _Optional[int] = ..., prefetch: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("seq", "running", "load", "attempts", "draining", "queued")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    running: int
    load: float
    attempts: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    draining: bool
    queued: int
    def __init__(self, seq: _Optional[int] = ..., running: _Optional[int] = ..., load: _Optional[float] = ..., attempts: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ..., draining: bool = ..., queued: _Optional[int] = ...) -> None: ...

class Started(_message.Message):
    __slots__ = ("run_id", "attempt", "started_at_ms")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt: int
    started_at_ms: int
    def __init__(self, run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., started_at_ms: _Optional[int] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("run_id", "attempt", "outcome", "exit_code", "http_status", "output", "started_at_ms", "ended_at_ms", "token", "no_retry", "retry_after_ms")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NO_RETRY_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt: int
    outcome: Outcome
    exit_code: int
    http_status: int
    output: str
    started_at_ms: int
    ended_at_ms: int
    token: int
    no_retry: bool
    retry_after_ms: int
    def __init__(self, run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., exit_code: _Optional[int] = ..., http_status: _Optional[int] = ..., output: _Optional[str] = ..., started_at_ms: _Optional[int] = ..., ended_at_ms: _Optional[int] = ..., token: _Optional[int] = ..., no_retry: bool = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class Output(_message.Message):
    __slots__ = ("run_id", "attempt", "token", "offset", "data")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt: int
    token: int
    offset: int
    data: bytes
    def __init__(self, run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., token: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("session_id", "lease_ttl_ms", "heartbeat_interval_ms", "leader_token", "reclaimed", "superseded")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LEADER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RECLAIMED_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    lease_ttl_ms: int
    heartbeat_interval_ms: int
    leader_token: int
    reclaimed: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    superseded: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    def __init__(self, session_id: _Optional[str] = ..., lease_ttl_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., leader_token: _Optional[int] = ..., reclaimed: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ..., superseded: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ...) -> None: ...

class NotLeader(_message.Message):
    __slots__ = ("leader_address",)
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    leader_address: str
    def __init__(self, leader_address: _Optional[str] = ...) -> None: ...

class Assign(_message.Message):
    __slots__ = ("run_id", "attempt", "token", "job", "namespace", "scheduled_at_ms", "executor_json", "timeout_ms", "idempotency_key", "params_json", "payload")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt: int
    token: int
    job: str
    namespace: str
    scheduled_at_ms: int
    executor_json: str
    timeout_ms: int
    idempotency_key: str
    params_json: str
    payload: str
    def __init__(self, run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., token: _Optional[int] = ..., job: _Optional[str] = ..., namespace: _Optional[str] = ..., scheduled_at_ms: _Optional[int] = ..., executor_json: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., params_json: _Optional[str] = ..., payload: _Optional[str] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("run_id", "attempt", "token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt: int
    token: int
    def __init__(self, run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., token: _Optional[int] = ...) -> None: ...

class Abort(_message.Message):
    __slots__ = ("run_id", "attempt", "token", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt: int
    token: int
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., token: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("heartbeat_seq", "report", "rejected_reason")
    HEARTBEAT_SEQ_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    REJECTED_REASON_FIELD_NUMBER: _ClassVar[int]
    heartbeat_seq: int
    report: AttemptRef
    rejected_reason: str
    def __init__(self, heartbeat_seq: _Optional[int] = ..., report: _Optional[_Union[AttemptRef, _Mapping]] = ..., rejected_reason: _Optional[str] = ...) -> None: ...
