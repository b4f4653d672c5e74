"""docs/scheduling.md: filter, then score — each filter and scorer, their sums, ties and refusals."""

from __future__ import annotations

import dataclasses
import zoneinfo
from typing import Any

import pytest

from channels_app.placement.chains import Candidate, Need, ScoreMaximums, place
from slotserve_base.target import Target

GiB = 2**30
WANT = Need(model="qwen", backend="llama.cpp", target=Target(1, 1), labels={}, need_bytes=20 * GiB)


def cand(name: str, **changes) -> Candidate:
    base = Candidate(
        id=hash(name) % 1000,
        name=name,
        node="n1",
        node_ready=True,
        labels={},
        backends=frozenset({"llama.cpp", "vllm"}),
        file_present=True,
        vram_bytes=24 * GiB,
        free_at_time=True,
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("changes", "wanted", "filter_name", "why"),
    [
        ({"node_ready": False}, WANT, "node_ready", "node n1 not ready"),
        ({}, dataclasses.replace(WANT, labels={"gpu": "a100"}), "labels", "lacks labels gpu=a100"),
        ({"labels": {"gpu": "a100"}}, dataclasses.replace(WANT, labels={"gpu": "a100"}), None, None),
        ({"backends": frozenset({"vllm"})}, WANT, "backend", "llama.cpp not installed on n1"),
        ({"file_present": False}, WANT, "file", "model file not on n1"),
        # A preset's draft model (speculative decoding) is a file the node must have too.
        ({"draft_present": False}, WANT, "file", "draft model file not on n1"),
        ({"draft_present": True}, WANT, None, None),
        ({"vram_bytes": 16 * GiB}, WANT, "memory", "too little GPU memory (needs 20.0 GiB, has 16.0 GiB)"),
        ({"vram_bytes": 20 * GiB}, WANT, None, None),
        # Weights left in RAM (llama.cpp's -ngl below the layers) must fit the node's RAM too.
        (
            {"ram_bytes": 16 * GiB},
            dataclasses.replace(WANT, ram_bytes=60 * GiB),
            "ram",
            "too little RAM (needs 60.0 GiB, has 16.0 GiB)",
        ),
        ({"ram_bytes": 64 * GiB}, dataclasses.replace(WANT, ram_bytes=60 * GiB), None, None),
        ({"ram_bytes": None}, dataclasses.replace(WANT, ram_bytes=60 * GiB), None, None),  # not reported
        ({"free_at_time": False}, WANT, "free", "booked at that time"),
    ],
)
def test_each_filter(changes, wanted, filter_name, why):
    result = place([cand("a", **changes)], wanted)
    if filter_name is None:
        assert [s.candidate.name for s in result.ranked] == ["a"]
    else:
        assert result.ranked == [] and result.removed == {filter_name: [("a", why)]}


def test_filters_run_in_the_seeds_order_labels_first_and_free_at_that_time_last():
    """Seed 001 (GPUStack's chain): labels, then worker status, backend, local path, resource
    fit; SlotServe's "free at that time" comes last. A channel failing several is counted under
    the first."""
    from channels_app.placement.chains import FILTERS

    assert [name for name, _ in FILTERS] == [
        "labels",
        "node_ready",
        "backend",
        "file",
        "memory",
        "ram",
        "free",
    ]
    everything_wrong = cand("a", node_ready=False, labels={}, free_at_time=False)
    result = place([everything_wrong], dataclasses.replace(WANT, labels={"gpu": "a100"}))
    assert list(result.removed) == ["labels"]
    assert result.message == "0/1 channels: 1 lacks the model's labels"


def test_nothing_fits_counts_every_reason():
    result = place(
        [cand("a", vram_bytes=16 * GiB), cand("b", vram_bytes=16 * GiB), cand("c", node_ready=False)],
        dataclasses.replace(WANT, need_bytes=int(23.1 * GiB)),
    )
    assert result.message == (
        "0/3 channels: 1 node not ready, 2 have too little GPU memory (needs 23.1 GiB, have 16.0 GiB)"
    )


def test_nothing_fits_names_too_little_ram_apart_from_gpu_memory():
    result = place(
        [cand("a", ram_bytes=16 * GiB), cand("b", ram_bytes=32 * GiB), cand("c", vram_bytes=16 * GiB)],
        dataclasses.replace(WANT, ram_bytes=60 * GiB),
    )
    assert result.message == (
        "0/3 channels: 1 has too little GPU memory (needs 20.0 GiB, has 16.0 GiB), "
        "2 have too little RAM (needs 60.0 GiB, have 16.0 GiB, 32.0 GiB)"
    )


def test_binpack_prefers_the_smallest_channel_that_fits():
    result = place(
        [cand("big", vram_bytes=80 * GiB), cand("small", vram_bytes=24 * GiB)], WANT, policy="binpack"
    )
    assert [s.candidate.name for s in result.ranked] == ["small", "big"]
    assert result.ranked[0].scores["placement"] == pytest.approx(100 * 20 / 24, abs=0.01)


def test_binpack_weighs_gpu_memory_2_and_ram_1_where_ram_applies():
    """Seed 001 (GPUStack's ResourceWeight): binpack scores the share each resource would be used,
    GPU memory weighing 2 and the machine's RAM 1; RAM applies where the model leaves weights in
    RAM (llama.cpp's layers beyond -ngl) and the node reports its RAM."""
    partly_offloaded = dataclasses.replace(WANT, ram_bytes=8 * GiB)
    roomy = cand("roomy", ram_bytes=64 * GiB)
    tight = cand("tight", ram_bytes=16 * GiB)
    ranked = place([roomy, tight], partly_offloaded, policy="binpack").ranked
    assert [s.candidate.name for s in ranked] == ["tight", "roomy"]
    assert ranked[0].scores["placement"] == pytest.approx(100 * (2 * 20 / 24 + 1 * 8 / 16) / 3, abs=0.01)
    assert ranked[1].scores["placement"] == pytest.approx(100 * (2 * 20 / 24 + 1 * 8 / 64) / 3, abs=0.01)
    # All on the GPU, or a node that does not report its RAM: GPU memory alone.
    assert place([tight], WANT).ranked[0].scores["placement"] == pytest.approx(100 * 20 / 24, abs=0.01)
    unknown = cand("unknown", ram_bytes=None)
    assert place([unknown], partly_offloaded).ranked[0].scores["placement"] == pytest.approx(
        100 * 20 / 24, abs=0.01
    )


def test_spread_counts_what_runs_and_is_booked_as_the_seed_weighs_it():
    """Seed 001: spread counts the instances of the current model and of the others (GPUStack's
    ModelWeight: others weigh 0.2) on the worker (weight 0.85) and on the GPUs (0.15), and
    prefers the fewest of the current model. For SlotServe a worker is the channel's node and
    its GPUs are the channel; an instance is a process running there or a booking around the
    slot."""
    empty = cand("empty", node="n3")
    others = cand("others", node="n2", node_others=2, channel_others=1)
    same = cand("same", node="n1", node_current=1)
    ranked = place([same, others, empty], WANT, policy="spread").ranked
    assert [s.candidate.name for s in ranked] == ["empty", "others", "same"]
    scores = [s.scores["placement"] for s in ranked]
    assert scores[0] == 100.0
    assert scores[1] == pytest.approx(100 * (0.85 / (1 + 0.2 * 2) + 0.15 / (1 + 0.2 * 1)), abs=0.01)
    assert scores[2] == pytest.approx(100 * (0.85 / (1 + 1) + 0.15 / 1), abs=0.01)
    # On one node, the channel that already has the model around the slot comes second.
    beside = cand("a-beside", node_current=1, channel_current=1)
    apart = cand("b-apart", node_current=1)
    assert [s.candidate.name for s in place([beside, apart], WANT, policy="spread").ranked] == [
        "b-apart",
        "a-beside",
    ]


def test_locality_and_sums():
    """Each scorer up to its own maximum; the total is their sum scaled to 100 (the seed's
    scale_factor = total_max / sum_max)."""
    loaded = cand("b-loaded", runs_target=True)
    plain = cand("a-plain")
    result = place([plain, loaded], WANT, maximums=ScoreMaximums(placement=10, locality=40, warm=50))
    assert [(s.candidate.name, s.scores, s.total) for s in result.ranked] == [
        (
            "b-loaded",
            {"placement": pytest.approx(8.33, abs=0.01), "locality": 40.0, "warm": 50.0},
            pytest.approx(98.33, abs=0.01),  # (8.33 + 40 + 50) * 100 / 100
        ),
        (
            "a-plain",
            {"placement": pytest.approx(8.33, abs=0.01), "locality": 40.0, "warm": 0.0},
            pytest.approx(48.33, abs=0.01),
        ),
    ]


@pytest.mark.parametrize(
    ("main", "draft", "score"),
    [
        (True, None, 5.0),  # no draft model: the main file alone
        (False, None, 0.0),
        (True, True, 5.0),
        (True, False, pytest.approx(5.0 / 1.5)),  # (1 + 0.5 · 0) / 1.5 × 5
        (False, True, pytest.approx(2.5 / 1.5)),  # (0 + 0.5 · 1) / 1.5 × 5
        (False, False, 0.0),
    ],
)
def test_locality_counts_a_draft_model_at_half_weight(main, draft, score):
    """Seed 001: ``(main_ratio + 0.5 · draft_ratio) / 1.5 × max`` for a preset with a draft model."""
    from channels_app.placement.chains import locality_score

    assert locality_score(cand("a", file_present=main, draft_present=draft), 5.0) == score


@pytest.mark.parametrize(
    ("backend", "args", "draft"),
    [
        ("llama.cpp", ["-md", "/m/draft.gguf", "-ngl", "99"], "/m/draft.gguf"),
        ("llama.cpp", ["--model-draft=/m/d.gguf"], "/m/d.gguf"),
        ("llama.cpp", ["-ngl", "99"], None),
        ("vllm", ["--speculative-config", '{"model": "/m/eagle", "num_speculative_tokens": 3}'], "/m/eagle"),
        ("vllm", ['--speculative-config={"method": "ngram", "num_speculative_tokens": 3}'], None),
        ("vllm", ["--speculative-config", "not json"], None),
        (
            "sglang",
            ["--speculative-draft-model-path", "/m/draft", "--speculative-algorithm", "EAGLE"],
            "/m/draft",
        ),
        ("sglang", ["-md", "/m/x.gguf"], None),  # llama.cpp's option means nothing to SGLang
    ],
)
def test_the_draft_model_is_read_from_each_backends_own_option(backend, args, draft):
    from channels_app.backends import draft_model_path

    assert draft_model_path(backend, args) == draft


@pytest.mark.django_db
def test_placement_reads_where_the_draft_file_is(ana_api, tmp_path):
    """The local-path filter counts the draft file as discovery found it on each node's disk."""
    from channels_app.models import ModelFile

    now = timezone.now()
    has_both = factories.node("has-both", backends=["llama.cpp"])
    main_only = factories.node("main-only", backends=["llama.cpp"])
    model = factories.llm("spec", path="/m/main.gguf")
    preset = factories.preset(model, "spec", "-md /m/draft.gguf")
    model.nodes.add(has_both, main_only)
    for node in (has_both, main_only):
        ModelFile.objects.create(
            node=node, path="/m/main.gguf", backend="llama.cpp", size_bytes=1, modified=now
        )
    ModelFile.objects.create(
        node=has_both, path="/m/draft.gguf", backend="llama.cpp", size_bytes=1, modified=now
    )
    factories.channel("a-main-only", on=main_only)
    factories.channel("b-has-both", on=has_both)
    query = {
        "model": model.name,
        "preset": preset.pk,
        "start": "2030-01-07T10:00Z",
        "end": "2030-01-07T11:00Z",
    }
    answer = ana_api.get("/api/placement", query).data
    assert [c["name"] for c in answer["channels"]] == ["b-has-both"], answer
    assert answer["removed"]["file"] == [
        {"channel": "a-main-only", "reason": "draft model file not on main-only"}
    ]


def test_scorer_maxima_as_the_seed_gives_them():
    """Seed 001: placement up to 100, model-file locality a light preference up to 5 (the file on
    the channel's node or not: the share of the candidate's workers that have it), 0 turns it
    off; the sum is scaled to 100."""
    defaults = ScoreMaximums()
    assert (defaults.placement, defaults.locality) == (100.0, 5.0)
    small, large = cand("small", vram_bytes=24 * GiB), cand("large", vram_bytes=80 * GiB)
    ranked = place([large, small], WANT).ranked
    assert [s.candidate.name for s in ranked] == ["small", "large"]  # locality cannot outweigh binpack
    assert ranked[0].scores["locality"] == 5.0
    scale = 100 / (defaults.placement + defaults.locality + defaults.warm)
    assert ranked[0].total == pytest.approx(sum(ranked[0].scores.values()) * scale)
    assert ranked[0].total <= 100
    off = place([large, small], WANT, maximums=ScoreMaximums(locality=0)).ranked
    assert all(s.scores["locality"] == 0.0 for s in off)


def test_ties_break_by_name():
    result = place([cand("zeta"), cand("alpha"), cand("mid")], WANT)
    assert [s.candidate.name for s in result.ranked] == ["alpha", "mid", "zeta"]


def test_unknown_policy_is_named():
    with pytest.raises(ValueError, match="placement policy 'pack'"):
        place([cand("a")], WANT, policy="pack")


# --- Through the API --------------------------------------------------------------

from datetime import timedelta  # noqa: E402

from django.utils import timezone  # noqa: E402

from tests import factories  # noqa: E402
from tests.factories import iso  # noqa: E402


def _inventory():
    node = factories.node("n1", gpus=3, memory=24 * GiB)
    node.backends = ["llama.cpp"]
    node.save()
    big = factories.node("n2", gpus=1, memory=80 * GiB)
    big.backends = ["llama.cpp"]
    big.save()
    channels = [factories.channel(f"small-{i}", on=node, gpu_indexes=[i]) for i in range(3)]
    channels.append(factories.channel("large", on=big))
    model = factories.llm("qwen", size=20 * GiB)
    model.path = "/nowhere/qwen.gguf"  # not readable here: the need is the file's size
    model.save()
    return channels, model


@pytest.mark.django_db
def test_placement_api_ranks_and_explains(ana_api):
    _, model = _inventory()
    start = timezone.now() + timedelta(hours=1)
    query = {"model": "qwen", "start": iso(start), "end": iso(start + timedelta(hours=1))}
    ranked = ana_api.get("/api/placement", query).data
    assert [c["name"] for c in ranked["channels"]] == ["small-0", "small-1", "small-2", "large"]
    assert ranked["channels"][0]["scores"]["placement"] == pytest.approx(100 * 20 / 24, abs=0.01)
    model.size_bytes = 30 * GiB
    model.save()
    one = ana_api.get("/api/placement", query).data
    assert [c["name"] for c in one["channels"]] == ["large"]
    assert len(one["removed"]["memory"]) == 3
    model.size_bytes = 100 * GiB
    model.save()
    none = ana_api.get("/api/placement", query).data
    assert none["message"] == (
        "0/4 channels: 4 have too little GPU memory (needs 100.0 GiB, have 24.0 GiB, 80.0 GiB)"
    )
    bad = ana_api.get("/api/placement", {**query, "policy": "pack"})
    assert bad.status_code == 400 and "policy" in bad.data


@pytest.mark.django_db(transaction=True)
def test_auto_channel_under_concurrency_gives_different_channels_or_409():
    import threading

    from django.db import connection
    from rest_framework.test import APIClient

    from reservations.models import Reservation

    _inventory()
    users = [factories.user(f"auto{i}") for i in range(6)]
    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    body = {
        "channel": "auto",
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
        "model": "qwen",
    }
    barrier = threading.Barrier(len(users))
    answers: list[tuple[int, Any]] = []

    def book(user) -> None:
        client = APIClient()
        client.force_authenticate(user)
        try:
            barrier.wait(timeout=30)
            answer = client.post("/api/reservations/", body, format="json")
            answers.append((answer.status_code, answer.data))
        finally:
            connection.close()

    threads = [threading.Thread(target=book, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    codes = sorted(code for code, _ in answers)
    assert codes == [201, 201, 201, 201, 409, 409]
    channels = [data["channel_name"] for code, data in answers if code == 201]
    assert sorted(channels) == ["large", "small-0", "small-1", "small-2"]
    refusals = [data["message"] for code, data in answers if code == 409]
    # Placed before the others committed ("booked meanwhile") or after ("4 are booked at that time").
    assert all(m.startswith("no channel can take this booking: ") for m in refusals), refusals
    assert Reservation.objects.count() == 4


@pytest.mark.django_db
def test_booking_form_with_any_channel(ana):
    from django.test import Client

    from channels_app.models import LLMModel
    from reservations.models import Reservation

    _inventory()
    portal = Client()
    portal.force_login(ana)
    start = timezone.localtime() + timedelta(hours=3)
    answer = portal.post(
        "/book/",
        {
            "channel": "",
            "start": start.strftime("%Y-%m-%dT%H:00"),
            "end": (start + timedelta(hours=1)).strftime("%Y-%m-%dT%H:00"),
            "model": LLMModel.objects.get(name="qwen").pk,
        },
    )
    assert answer.status_code == 302, answer.content.decode()[:1000]
    assert Reservation.objects.get(user=ana).channel.name == "small-0"
    assert "Any channel that fits" in portal.get("/book/").content.decode()


@pytest.mark.django_db
def test_hint_when_the_gpus_report_too_little_free_memory(tiny_gguf, ana_api):
    from channels_app.models import Gpu

    model = factories.llm("tiny")
    model.path = str(tiny_gguf)
    model.save()
    preset = factories.preset(model, "short", "-c 128")
    channel = factories.channel("shared")
    Gpu.objects.filter(node=channel.node).update(free_bytes=100 * 2**20)  # someone else holds the rest
    start = timezone.now() + timedelta(minutes=10)
    answer = ana_api.get(
        "/api/reservations/hints",
        {
            "channel": channel.pk,
            "start": iso(start),
            "end": iso(start + timedelta(hours=1)),
            "model": model.pk,
            "preset": preset.pk,
        },
    )
    codes = [w["code"] for w in answer.data["warnings"]]
    assert codes == ["estimated_memory_exceeds_free"]


@pytest.mark.django_db
def test_a_models_own_placement_strategy_drives_any_channel_and_the_suggestions(ana_api, staff_api, ana, bo):
    """Seed 001: the strategy is the model's (GPUStack's placement_strategy); the API's ?policy=
    still overrides it for one question."""
    channels, model = _inventory()
    start = timezone.now().replace(microsecond=0) + timedelta(hours=3)
    # small-0 is busy around the slot: its node n1 is partly booked, n2 not at all.
    factories.reservation(
        owner=bo, on=channels[0], start=start - timedelta(hours=4), end=start + timedelta(hours=6)
    )
    query = {"model": "qwen", "start": iso(start), "end": iso(start + timedelta(hours=1))}
    assert ana_api.get("/api/placement", query).data["channels"][0]["name"] == "small-1"  # binpack
    assert (
        staff_api.patch(f"/api/models/{model.pk}/", {"placement_strategy": "pack"}, format="json").status_code
        == 400
    )
    changed = staff_api.patch(f"/api/models/{model.pk}/", {"placement_strategy": "spread"}, format="json")
    assert changed.status_code == 200 and changed.data["placement_strategy"] == "spread"
    assert ana_api.get("/api/placement", query).data["channels"][0]["name"] == "large"
    assert (
        ana_api.get("/api/placement", {**query, "policy": "binpack"}).data["channels"][0]["name"] == "small-1"
    )
    booked = ana_api.post(
        "/api/reservations/",
        {"channel": "auto", "model": "qwen", "start": iso(start), "end": iso(start + timedelta(hours=1))},
        format="json",
    )
    assert booked.status_code == 201 and booked.data["channel_name"] == "large", booked.data


@pytest.mark.django_db
def test_spread_counts_the_processes_and_bookings_of_each_channel_and_node(ana_api, bo):
    """What spread counts, from the database: a process running the model now and the bookings
    within 12 hours of the slot, the model's own apart from the others'."""
    from channels_app.models import ChannelRuntime
    from channels_app.placement.inputs import placement_inputs

    channels, model = _inventory()
    other = factories.llm("other", size=GiB)
    now = timezone.now()
    start = now.replace(microsecond=0) + timedelta(hours=2)
    ChannelRuntime.objects.create(channel=channels[0], phase="ready", model=model, port=1, pid=1)
    factories.reservation(
        owner=bo,
        on=channels[1],
        start=start - timedelta(hours=3),
        end=start - timedelta(hours=1),
        target=factories.preset(other),
    )
    factories.reservation(  # a day later: outside the window
        owner=bo,
        on=channels[3],
        start=start + timedelta(days=1),
        end=start + timedelta(days=1, hours=1),
        target=factories.preset(model),
    )
    candidates, _ = placement_inputs(
        model=model, preset=None, start=start, end=start + timedelta(hours=1), now=now
    )
    counts = {
        c.name: (c.channel_current, c.channel_others, c.node_current, c.node_others) for c in candidates
    }
    assert counts == {
        "small-0": (1, 0, 1, 1),
        "small-1": (0, 1, 1, 1),
        "small-2": (0, 0, 1, 1),
        "large": (0, 0, 0, 0),
    }
    query = {"model": "qwen", "start": iso(start), "end": iso(start + timedelta(hours=1)), "policy": "spread"}
    ranked = ana_api.get("/api/placement", query).data["channels"]
    # (small-0 runs the model already: the warm scorer adds to its total, not to its placement.)
    by_placement = sorted(ranked, key=lambda c: -c["scores"]["placement"])
    assert [c["name"] for c in by_placement] == ["large", "small-2", "small-1", "small-0"]


@pytest.mark.django_db
def test_the_node_reports_its_ram_and_the_estimate_what_stays_in_it(tiny_gguf, settings):
    """The RAM term's two sides: a node worker's heartbeat records the machine's memory, and a
    preset offloading fewer layers than the model has leaves the rest in RAM."""
    import os

    from channels_app.node_worker import registration
    from channels_app.placement.memory import estimate_for

    settings.SLOTSERVE_MODEL_DIRS = []
    node = registration.heartbeat(node_name="ram-node", now=timezone.now())
    node.refresh_from_db()
    assert node.ram_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    whole = estimate_for(backend="llama.cpp", path=str(tiny_gguf), args=[])
    assert whole.ram == 0
    half = estimate_for(backend="llama.cpp", path=str(tiny_gguf), args=["-ngl", "1"])
    assert half.ram > 0 and half.ram + half.weights == whole.weights


def test_the_first_free_times_skip_booked_ones_and_offer_each_free_stretch_once():
    """The free-slot finder's search, pure: from each start in turn, the first time some channel
    that fits is free for the whole length. A channel's free stretch is offered once, with how
    long it lasts, not cut into back-to-back pieces; the next offer is another stretch."""
    from datetime import UTC, datetime

    from channels_app.placement.chains import first_free

    t0 = datetime(2026, 12, 7, 9, tzinfo=UTC)
    hour = timedelta(hours=1)
    a, b = cand("a", id=1), cand("b", id=2, vram_bytes=80 * GiB)
    busy = {1: [(t0, t0 + 3 * hour)], 2: [(t0 - hour, t0 + 2 * hour)]}
    starts = [t0 + i * hour / 2 for i in range(20)]
    found = first_free([a, b], WANT, busy=busy, starts=starts, length=2 * hour, count=2)
    assert [(f.start, [s.candidate.name for s in f.ranked], f.free_until) for f in found] == [
        (t0 + 2 * hour, ["b"], None),  # a is booked until 12:00; b is free from 11:00 on
        (t0 + 3 * hour, ["a"], None),  # a's stretch, from 12:00; b's was offered already
    ]
    # A stretch that ends says when.
    busy[2].append((t0 + 6 * hour, t0 + 7 * hour))
    (first,) = first_free([b], WANT, busy=busy, starts=starts, length=2 * hour, count=1)
    assert (first.start, first.free_until) == (t0 + 2 * hour, t0 + 6 * hour)
    assert first_free([a], WANT, busy={1: [(t0, t0 + 48 * hour)]}, starts=starts, length=hour, count=1) == []


@pytest.mark.django_db
def test_the_free_slot_finder_through_the_api(ana_api, bo):
    channels, model = _inventory()
    for node in {c.node for c in channels}:
        node.last_heartbeat = timezone.now()
        node.save()
    after = timezone.now().replace(microsecond=0) + timedelta(days=1)
    # Every channel is booked for the first three hours after ``after``.
    for channel in channels:
        factories.reservation(
            owner=bo, on=channel, start=after - timedelta(hours=1), end=after + timedelta(hours=3)
        )
    answer = ana_api.get(
        "/api/placement/free-slots", {"model": "qwen", "hours": 2, "after": iso(after), "count": 2}
    )
    assert answer.status_code == 200, answer.data
    slots = answer.data["slots"]
    # Every channel frees at once and stays free: one stretch, offered once, with all of them.
    assert len(slots) == 1 and slots[0]["start"] >= after + timedelta(hours=3)
    assert slots[0]["start"] < after + timedelta(hours=3, minutes=30)  # the first half hour once free
    assert slots[0]["free_until"] is None and len(slots[0]["channels"]) >= 2
    assert slots[0]["channels"][0]["name"].startswith("small-")
    # In words as every page names a time: the caller's zone by its name (IST, not GMT+5:30).
    from reservations.wording import slot_words

    in_kolkata = zoneinfo.ZoneInfo("Asia/Kolkata")
    factories.in_zone(ana_api.handler._force_user, "Asia/Kolkata")
    worded = ana_api.get(
        "/api/placement/free-slots", {"model": "qwen", "hours": 2, "after": iso(after), "count": 2}
    ).data["slots"][0]
    assert worded["words"] == slot_words(worded["start"], worded["end"], in_kolkata)
    assert worded["words"].endswith(" IST") and worded["free_until_words"] == ""
    for bad, field in (({"hours": 0}, "hours"), ({"hours": "x"}, "hours"), ({"model": "nope"}, "model")):
        refused = ana_api.get("/api/placement/free-slots", {"model": "qwen", "hours": 2, **bad})
        assert refused.status_code == 400 and field in str(refused.data), refused.data
    model.size_bytes = 200 * GiB
    model.save()
    none = ana_api.get("/api/placement/free-slots", {"model": "qwen", "hours": 2}).data
    assert none["slots"] == [] and "have too little GPU memory" in none["message"]
