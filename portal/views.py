"""Portal pages that show things: overview, calendar, models."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST
from redis.exceptions import RedisError

from channels_app.inventory.services import model_register
from channels_app.models import HEARTBEAT_TICKS, Channel, Gpu, LLMModel, ModelFile, Node, Preset
from channels_app.scheduling import selectors
from channels_app.scheduling.selectors import preset_load_estimates
from portal.channel_reasons import BookingFacts, loading_words, why
from portal.forms import OverrideForm
from reservations.hints import memory_estimate
from reservations.models import Reservation
from reservations.selectors import blackouts_ahead, bookable_by, bulletins_shown
from slotserve_base.admin_fields import gib as gib_of
from slotserve_base.errors import InvalidInput
from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase, Reason

PRELOADING = {Reason.PRELOAD_NEXT, Reason.SKIP_DEFAULT_SHORT_GAP, Reason.STOP_FOR_EXCLUSIVE}
MANUAL = {Reason.MANUAL_OVERRIDE, Reason.MANUAL_UNLOAD}


@dataclass
class ChannelCard:
    channel: Channel
    ready: bool
    phase: str
    running: str
    why: str
    active: Reservation | None
    error: str
    fallback: bool
    retry_at: datetime | None
    loading_elapsed: float | None = None
    loading: str = ""  # "loading: 12 s so far, usually about 40 s"
    override_form: OverrideForm | None = None
    override_selects: tuple[SafeString, SafeString] | None = None  # its model and preset lists
    controls_lazy: bool = False  # staff's controls fetched as they are opened (``CONTROLS_INLINE``)
    busy: str = ""  # its places in use and its fair queue, e.g. "2 of 2 places in use · 3 waiting"
    default: str = ""  # what it runs when nothing else is asked, e.g. "qwen / chat"
    start_worker: str = ""  # staff, while its node is not ready: the command that starts its worker
    gpu_use: list[str] = field(
        default_factory=list
    )  # each of its GPUs now: "GPU 0: 43 % · 12.1 of 24 GiB · 61 °C"
    links: dict[str, str] = field(default_factory=dict)  # its pages: book, run_log, story, controls


def target_label(model: LLMModel | None, preset: Preset | None) -> str:
    if model is None:
        return "—"
    return f"{model.name} / {preset.name}" if preset else model.name


# Up to this many channels, each card carries its controls (the override form); past it they
# are fetched as a card's "Channel controls" is opened (``channel_controls``): 200 cards with
# their model and preset lists made a page of half a megabyte.
CONTROLS_INLINE = 24


def gpu_use_words(gpus: Iterable[Gpu], indexes: Iterable[int], now: datetime) -> list[str]:
    """What each of a channel's GPUs is doing, as its node's heartbeat last saw it (no older than
    the heartbeat's own limit): use, memory held of all, temperature, each where known."""
    fresh_after = now - timedelta(seconds=HEARTBEAT_TICKS * settings.SLOTSERVE_TICK_SECONDS)
    by_index = {gpu.index: gpu for gpu in gpus}
    said = []
    for index in indexes:
        gpu = by_index.get(index)
        if gpu is None or gpu.sampled_at is None or gpu.sampled_at < fresh_after:
            continue
        parts = []
        if gpu.utilization_percent is not None:
            parts.append(f"{gpu.utilization_percent} % busy")
        if gpu.free_bytes is not None:
            used = gpu.memory_bytes - gpu.free_bytes
            parts.append(f"{gib_of(used)} of {gib_of(gpu.memory_bytes)} held")
        if gpu.temperature_c is not None:
            parts.append(f"{gpu.temperature_c} °C")
        if parts:
            said.append(f"GPU {index}: " + " · ".join(parts))
    return said


def url_maker(name: str) -> Callable[[int], str]:
    """``reverse(name, args=[pk])`` for many objects, reversed once: the overview's 200 cards
    reversed 800 URLs through the template's ``url`` tag, a third of its rendering time."""
    marker = "2147483647"
    head, tail = reverse(name, args=[int(marker)]).split(marker)
    return lambda pk: f"{head}{pk}{tail}"


def channel_cards(*, now: datetime, staff: bool) -> list[ChannelCard]:
    channels = list(
        Channel.objects.select_related(
            "node",
            "default_model",
            "default_preset",
            "runtime__model",
            "runtime__preset",
            "target__reservation__user",
        ).prefetch_related("node__gpus")
    )
    active = {
        r.channel_id: r for r in Reservation.objects.active_at(now).select_related("user", "model", "preset")
    }
    tz = timezone.get_current_timezone()
    cards = []
    loading: list[tuple[ChannelCard, Target]] = []
    lazy = staff and len(channels) > CONTROLS_INLINE
    selects = OverrideForm.shared_selects() if staff and not lazy else None
    book = reverse("portal:book")
    run_log, story, controls = (url_maker(n) for n in ("portal:run_log", "story", "portal:channel_controls"))
    for channel in channels:
        runtime, target = channel.runtime_or_none(), channel.target_or_none()
        booking = None
        if target is not None and target.reservation is not None:
            r = target.reservation
            booking = BookingFacts(user=r.user.username, start=r.start, end=r.end)
        reason = (runtime and runtime.fallback and "fallback_default") or (target.reason if target else None)
        card = ChannelCard(
            channel=channel,
            ready=channel.node.is_ready(now),
            phase=runtime.phase if runtime else Phase.STOPPED,
            running=target_label(runtime.model, runtime.preset) if runtime else "—",
            why=why(
                reason=reason, booking=booking, valid_until=target.valid_until if target else None, tz=tz
            ),
            active=active.get(channel.pk),
            error=runtime.error if runtime else "",
            fallback=bool(runtime and runtime.fallback),
            retry_at=runtime.retry_at if runtime else None,
            override_form=OverrideForm(prefix=f"ch{channel.pk}") if selects else None,
            override_selects=selects.for_prefix(f"ch{channel.pk}") if selects else None,
            controls_lazy=lazy,
            default=target_label(channel.default_model, channel.default_preset)
            if channel.default_model_id
            else "",
            links={
                "book": f"{book}?channel={channel.pk}",
                "run_log": run_log(channel.pk),
                "story": story(channel.pk),
                "controls": controls(channel.pk),
            },
        )
        if card.ready:
            card.gpu_use = gpu_use_words(channel.node.gpus.all(), channel.gpu_indexes, now)
        if staff and not card.ready:
            card.start_worker = (
                f"SLOTSERVE_NODE_NAME={channel.node.name} .venv/bin/python manage.py nodeworker"
            )
        if runtime is not None and runtime.phase == Phase.LOADING and runtime.model_id is not None:
            card.loading_elapsed = (now - runtime.since).total_seconds()
            card.loading = loading_words(elapsed=card.loading_elapsed, estimate=None)
            loading.append((card, Target(runtime.model_id, runtime.preset_id)))
        cards.append(card)
    _tell_how_busy([c for c in cards if c.phase in (Phase.READY, Phase.DRAINING)])
    if loading:
        estimates = selectors.load_estimates((c.channel.node_id, t) for c, t in loading)
        for card, target_ in loading:
            card.loading = loading_words(
                elapsed=card.loading_elapsed or 0.0, estimate=estimates[(card.channel.node_id, target_)]
            )
    return cards


def _tell_how_busy(cards: list[ChannelCard]) -> None:
    """Each card's places in use and fair queue (docs/gateway.md, "Fair sharing under
    contention"), read from Redis; nothing said while Redis is away."""
    from gateway.wire.queue_scripts import queue_stats
    from slotserve_base.inflight import in_flight_counts
    from slotserve_base.redis_client import redis_client

    ids = [card.channel.pk for card in cards]
    client = redis_client()
    try:
        counts, queues = in_flight_counts(client, ids), queue_stats(client, ids)
    except RedisError:
        return
    for card in cards:
        runtime = card.channel.runtime_or_none()
        places = runtime.places if runtime is not None else None
        if places is None:
            continue
        held, taken, waited = queues[card.channel.pk]
        parts = [f"{counts[card.channel.pk]} of {places} places in use", f"{held} waiting"]
        if taken:
            parts.append(f"{waited / taken:.1f} s average wait")
        card.busy = " · ".join(parts)


def viewer_of(request: HttpRequest) -> User:
    """The signed-in user of a page behind ``login_required``."""
    assert isinstance(request.user, User), "view needs login_required"
    return request.user


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    cards = channel_cards(now=now, staff=request.user.is_staff)
    if request.GET.get("partial"):
        return render(request, "portal/_channel_cards.html", {"cards": cards, "now": now})
    context = {
        "cards": cards,
        "now": now,
        # From staff (docs/portal.md, "Blackouts and bulletins"): what they say, and the
        # channels closed now or within the week.
        "bulletins": bulletins_shown(now),
        "closed_ahead": blackouts_ahead(now),
    }
    return render(request, "portal/overview.html", context)


@staff_member_required
def channel_controls(request: HttpRequest, pk: int) -> HttpResponse:
    """A channel's controls (its override form, reload), for a card that fetches them as opened."""
    channel = get_object_or_404(Channel, pk=pk)
    selects = OverrideForm.shared_selects()
    card = {
        "channel": channel,
        "override_form": OverrideForm(prefix=f"ch{pk}"),
        "override_selects": selects.for_prefix(f"ch{pk}"),
    }
    return render(request, "portal/_channel_controls.html", {"card": card})


@login_required
def run_log(request: HttpRequest, pk: int) -> HttpResponse:
    """The last lines of the channel's current or last run, as the process wrote them; the page
    then follows new lines live (``GET /api/channels/{id}/log?after=<cursor>``)."""
    from channels_app.node_worker.run_logs import for_member, recent_lines_with_cursor

    user = request.user
    assert isinstance(user, User)
    # The channel story's rule: members read the channels they may book, without the lines
    # about single requests.
    channel = get_object_or_404(bookable_by(user), pk=pk)
    lines, cursor = recent_lines_with_cursor(channel, 200)
    if not user.is_staff:
        lines = for_member(lines)
    return render(request, "portal/run_log.html", {"channel": channel, "lines": lines, "cursor": cursor})


@login_required
def models_page(request: HttpRequest) -> HttpResponse:
    channels = list(Channel.objects.select_related("node").prefetch_related("node__gpus"))
    by_target = preset_load_estimates()
    node_names = dict(Node.objects.values_list("pk", "name"))

    def loads(model_id: int, preset_id: int) -> str:
        """The scheduler's estimate of this preset on each node, e.g. "here 500 s, there 65 s"."""
        found = sorted(
            (node_names.get(n, "?"), s)
            for (m, p, n), s in by_target.items()
            if (m, p) == (model_id, preset_id)
        )
        return ", ".join(f"{name} {round(seconds)} s" for name, seconds in found)

    rows = []
    for model in LLMModel.objects.prefetch_related("presets", "nodes"):
        worst = max((s for (m, _, _), s in by_target.items() if m == model.pk), default=0.0)
        rows.append(
            {
                "model": model,
                "estimate": round(worst),
                "presets": [
                    (p, " ".join(p.args_effective), memory_estimate(model, p), loads(model.pk, p.pk))
                    for p in model.presets.all()
                ],
                "exceeds": [c.name for c in channels if model.size_bytes > c.vram_bytes()],
                "present_on": [n.name for n in model.nodes.all()],
            }
        )
    registered = LLMModel.objects.values("path")
    unregistered = ModelFile.objects.exclude(path__in=registered).select_related("node")
    return render(request, "portal/models.html", {"rows": rows, "unregistered": unregistered})


@staff_member_required
@require_POST
def register_model_file(request: HttpRequest, pk: int) -> HttpResponse:
    """Register a model for a file a node worker found, named after the file."""
    found = get_object_or_404(ModelFile, pk=pk)
    name = Path(found.path).stem if found.backend == "llama.cpp" else Path(found.path).name
    try:
        model_register(
            name=name,
            backend=found.backend,
            path=found.path,
            size_bytes=found.size_bytes,
            nodes=Node.objects.filter(model_files__path=found.path),
        )
    except InvalidInput as problem:
        messages.error(request, f"Not registered: {problem.message}.")
        return redirect("portal:models")
    messages.success(request, f"Model {name} registered; add presets for it in the admin or the API.")
    return redirect("portal:models")
