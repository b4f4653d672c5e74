"""What the lifecycle (``channels_app.node_worker.lifecycle``) steps over: a channel's process
state, what it is wanted to run, what was observed of it, and the actions a step asks for."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase, WebhookEvent


@dataclass(frozen=True)
class Failure:
    """A failure episode: the target that failed, what it was wanted for (``Wanted.purpose``),
    since when it fails, how often it failed in a row, and when to try again.

    An episode starts with a failed load and ends when its target loads, is no longer wanted
    for the same purpose (the booking ended, another booking of the same model began), or is
    reloaded; its retries, fallback, error and notifications are its own (docs/scheduling.md
    "Retries")."""

    target: Target
    attempts: int
    retry_at: datetime
    error: str
    fallback_failed: bool = False
    purpose: str = ""
    began: datetime | None = None


@dataclass(frozen=True)
class Sleeper:
    """A process put to sleep (its weights in host RAM), kept to be woken for its next turn."""

    target: Target
    pid: int
    since: datetime


@dataclass(frozen=True)
class ProcessState:
    """What the node worker knows of a channel's process (``ChannelRuntime``)."""

    phase: Phase = Phase.STOPPED
    running: Target | None = None
    since: datetime | None = None
    pid: int | None = None
    stop_sent_at: datetime | None = None
    kill_sent: bool = False
    fallback: bool = False
    failing: bool = False
    failure: Failure | None = None
    error: str = ""
    reload_generation: int = 0
    asleep: Sleeper | None = None  # the channel's one sleeping process, beside the running one
    sleeping_out: bool = False  # STOPPING by putting the process to sleep, not by its exit
    waking: bool = False  # LOADING by waking a sleeper, not by a start


@dataclass(frozen=True, kw_only=True)
class Wanted:
    """What the scheduler stored for the channel, and the settings that bound each phase
    (``SLOTSERVE_DRAIN_SECONDS``, ``SLOTSERVE_STOP_TIMEOUT_SECONDS``,
    ``SLOTSERVE_LOAD_TIMEOUT_SECONDS``: given by ``rows.wanted_of``, defaults nowhere but in
    the settings)."""

    target: Target | None
    default: Target | None = None
    serves_reservation: bool = False
    # What the target is wanted for: ``reservation:<id>``, or the decision's reason. A failure
    # episode belongs to one purpose: a later booking of the same model starts afresh.
    purpose: str = ""
    reload_generation: int = 0
    # What the channel will want again (its default, its coming bookings): a process running one
    # of these sleeps when it leaves, where it can (docs/scheduling.md, "Sleep and wake").
    returning: frozenset[Target] = frozenset()
    drain_seconds: float
    stop_timeout_seconds: float
    load_timeout_seconds: float


@dataclass(frozen=True)
class Observed:
    """What the node worker saw of the process this tick."""

    alive: bool = False
    exit_code: int | None = None
    healthy: bool = False
    in_flight: int = 0
    gpu_freed: bool = True
    log_tail: str = ""
    backend: str = ""  # of the model the process runs: its out-of-memory advice names its options
    sleep_fits: bool = False  # its backend sleeps, and host RAM holds its weights
    sleeping: bool | None = None  # what the process says (vLLM's /is_sleeping); None: not asked
    sleeper_alive: bool = False  # the channel's sleeping process still runs
    wake_failed: str = ""  # what the sleeper answered to being woken, when it could not wake


# --- Actions the worker performs -------------------------------------------


@dataclass(frozen=True)
class Start:
    target: Target
    fallback: bool = False


@dataclass(frozen=True)
class Terminate:
    pid: int


@dataclass(frozen=True)
class Kill:
    pid: int


@dataclass(frozen=True)
class Sleep:
    """Put the process to sleep: its weights go to host RAM, its GPU memory is freed."""

    pid: int


@dataclass(frozen=True)
class Wake:
    """Wake the channel's sleeper: its weights go back to the GPU."""

    pid: int


@dataclass(frozen=True)
class LoadFinished:
    """Close the load record of the current run: a success, or a failure and why."""

    succeeded: bool
    error: str = ""


@dataclass(frozen=True)
class Tell:
    """A fact the phase alone does not say (``node_worker.announce`` tells it): a run failed
    (each time), the default model serves as a fallback, the booked model serves again after a
    failure, the booked model is ready. ``episode``: when the failure episode began; whoever
    tells people of a failure, a fallback or a recovery does so once per episode."""

    event: WebhookEvent
    episode: datetime | None = None


Action = Start | Terminate | Kill | Sleep | Wake | LoadFinished | Tell


@dataclass(frozen=True)
class Step:
    state: ProcessState
    actions: list[Action] = field(default_factory=list)
