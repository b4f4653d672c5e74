"""How many requests a ready process serves at once, its *places* (docs/gateway.md, "Fair sharing
under contention"), as the node worker stores them with the channel's state."""

from __future__ import annotations

from channels_app.backends import Backend, places_asked
from channels_app.models import ChannelRuntime
from channels_app.node_worker import processes
from channels_app.node_worker.step_reads import StepReads

# What each run's llama-server said of its slots (``/props``), by run.
_slots_told: dict[str, int | None] = {}


def places_of(runtime: ChannelRuntime, reads: StepReads | None = None) -> int | None:
    """The requests the ready process serves at once (docs/gateway.md "Fair sharing under
    contention"): its preset's ``places`` (read at each look, so an edit counts at once), else
    what llama-server said when it was ready (``/props``), else what its arguments ask for or
    its backend's default."""
    reads = reads or StepReads()
    preset = reads.preset(runtime.preset_id)
    if preset is not None and preset.places:
        return preset.places
    model = reads.model(runtime.model_id)
    if model is None:
        return None
    backend = model.backend
    if backend == Backend.LLAMA_CPP and runtime.port is not None and runtime.run_id:
        if runtime.run_id not in _slots_told:  # asked once per run
            if len(_slots_told) > 256:
                _slots_told.clear()
            _slots_told[runtime.run_id] = processes.slots(runtime.host, runtime.port, runtime.api_secret)
        told = _slots_told[runtime.run_id]
        if told is not None:
            return told
    try:
        args = preset.args_list if preset is not None else []
    except ValueError:
        args = []
    return places_asked(backend, args)
