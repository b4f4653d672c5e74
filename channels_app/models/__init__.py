"""GPU nodes (``machines``), models and presets (``catalog``), channels (``channel``), and what
the scheduler and the node workers keep of each channel (``state``)."""

from __future__ import annotations

from channels_app.models.catalog import LLMModel as LLMModel
from channels_app.models.catalog import ModelAlias as ModelAlias
from channels_app.models.catalog import ModelFile as ModelFile
from channels_app.models.catalog import Preset as Preset
from channels_app.models.catalog import alias_name_problem as alias_name_problem
from channels_app.models.catalog import model_name_problem as model_name_problem
from channels_app.models.catalog import preset_args_error as preset_args_error
from channels_app.models.catalog import split_preset_args as split_preset_args
from channels_app.models.catalog import validate_target as validate_target
from channels_app.models.channel import ApprovalPolicy as ApprovalPolicy
from channels_app.models.channel import Channel as Channel
from channels_app.models.channel import GpuClaim as GpuClaim
from channels_app.models.channel import channel_gpus_problem as channel_gpus_problem
from channels_app.models.machines import HEARTBEAT_TICKS as HEARTBEAT_TICKS
from channels_app.models.machines import Gpu as Gpu
from channels_app.models.machines import Node as Node
from channels_app.models.state import ChannelRuntime as ChannelRuntime
from channels_app.models.state import ChannelTarget as ChannelTarget
from channels_app.models.state import LoadRecord as LoadRecord
from channels_app.models.state import OnDemandLoad as OnDemandLoad
from channels_app.models.state import OnDemandRelease as OnDemandRelease
from channels_app.models.state import Override as Override
from channels_app.models.state import ReloadRequest as ReloadRequest
from channels_app.models.story import StoryEntry as StoryEntry
from channels_app.models.story import StoryKind as StoryKind
