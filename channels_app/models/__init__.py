"""GPU nodes, channels, models, presets, overrides, load records and channel state."""

from __future__ import annotations

from channels_app.models.inventory import HEARTBEAT_TICKS as HEARTBEAT_TICKS
from channels_app.models.inventory import ApprovalPolicy as ApprovalPolicy
from channels_app.models.inventory import Channel as Channel
from channels_app.models.inventory import Gpu as Gpu
from channels_app.models.inventory import GpuClaim as GpuClaim
from channels_app.models.inventory import LLMModel as LLMModel
from channels_app.models.inventory import ModelAlias as ModelAlias
from channels_app.models.inventory import ModelFile as ModelFile
from channels_app.models.inventory import Node as Node
from channels_app.models.inventory import Preset as Preset
from channels_app.models.inventory import alias_name_problem as alias_name_problem
from channels_app.models.inventory import channel_gpus_problem as channel_gpus_problem
from channels_app.models.inventory import model_name_problem as model_name_problem
from channels_app.models.inventory import preset_args_error as preset_args_error
from channels_app.models.inventory import split_preset_args as split_preset_args
from channels_app.models.inventory import validate_target as validate_target
from channels_app.models.state import ChannelRuntime as ChannelRuntime
from channels_app.models.state import ChannelTarget as ChannelTarget
from channels_app.models.state import LoadRecord as LoadRecord
from channels_app.models.state import Override as Override
from channels_app.models.state import ReloadRequest as ReloadRequest
