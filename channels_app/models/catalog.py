"""The catalog: models, their aliases and presets, and the model files nodes found on disk."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from channels_app.backends import Backend, effective_args
from channels_app.models.machines import Node
from slotserve_base.errors import InvalidInput

if TYPE_CHECKING:
    pass


class LLMModel(models.Model):
    """A model file (GGUF) or folder (HF) on nodes' disks, with its backend."""

    name = models.CharField(max_length=200, unique=True)
    backend = models.CharField(max_length=20, choices=Backend.choices)
    path = models.CharField(max_length=1000)
    size_bytes = models.BigIntegerField(default=0)
    nodes = models.ManyToManyField(
        Node, blank=True, related_name="models", help_text="Nodes whose disk holds the file."
    )
    labels = models.JSONField(
        default=dict, blank=True, help_text="Labels a channel must carry to run this model."
    )
    placement_strategy = models.CharField(
        max_length=10,
        choices=[
            ("binpack", "binpack: the smallest channel that fits"),
            ("spread", "spread: the least busy"),
        ],
        default="binpack",
        help_text="How 'any channel' bookings and the dialog's suggestions choose a channel (seed 001).",
    )
    loads_on_demand = models.BooleanField(
        default=True,
        db_default=True,
        help_text="A request for this model may load it on a free channel when no channel runs it "
        '(docs/scheduling.md, "Loaded on demand").',
    )
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        verbose_name = "model"
        constraints = [
            models.CheckConstraint(condition=Q(size_bytes__gte=0), name="model_size_not_negative"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The rule every door shares (the API, the admin, the portal's "register"): no model is
        named like an alias, or the gateway could not tell which one a request names."""
        problem = model_name_problem(self.name)
        if problem:
            raise ValidationError({"name": problem})


class ModelAlias(models.Model):
    """Another name clients may use for a model (``gpt-4o-mini`` → a local model): the gateway
    routes a request for the alias as one for the model. No alias is also a model's name."""

    name = models.CharField(max_length=200, unique=True)
    model = models.ForeignKey(LLMModel, on_delete=models.CASCADE, related_name="aliases")

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "model aliases"
        constraints = [models.CheckConstraint(condition=~Q(name=""), name="model_alias_name_not_empty")]

    def __str__(self) -> str:
        return f"{self.name} → {self.model}"

    def clean(self) -> None:
        problem = alias_name_problem(self.name)
        if problem:
            raise ValidationError({"name": problem})


def alias_name_problem(name: str) -> str:
    """Why ``name`` cannot be an alias ("" when it can): a model has that name."""
    if LLMModel.objects.filter(name=name).exists():
        return f"{name!r} is the name of a model; an alias needs a name of its own"
    return ""


def model_name_problem(name: str) -> str:
    """Why ``name`` cannot be a model's name ("" when it can): an alias of a model has it."""
    taken = ModelAlias.objects.filter(name=name).select_related("model").first()
    if taken is not None:
        return f"{name!r} is an alias of model {taken.model.name}; remove the alias first"
    return ""


class Preset(models.Model):
    """Extra command-line arguments for a model; model + preset is one target."""

    model = models.ForeignKey(LLMModel, on_delete=models.CASCADE, related_name="presets")
    name = models.CharField(max_length=100)
    args = models.TextField(blank=True, help_text="Split like a shell would, never run by one.")
    places = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Requests the process serves at once, for the gateway's fair queue (empty: what "
        "the process says when it is ready, or its arguments' -np, --max-num-seqs, "
        "--max-running-requests).",
    )

    class Meta:
        ordering = ["model__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["model", "name"], name="preset_unique_name_per_model"),
            models.CheckConstraint(
                condition=Q(places__isnull=True) | Q(places__gte=1), name="preset_places_at_least_one"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}/{self.name}"

    def clean(self) -> None:
        """The rule every edge shares (API, admin): the arguments split like a shell would."""
        error = preset_args_error(self.args)
        if error:
            raise ValidationError({"args": error})

    @property
    def args_error(self) -> str:
        """Why the stored arguments cannot be used ("" when they can)."""
        return preset_args_error(self.args)

    @property
    def args_list(self) -> list[str]:
        """The arguments as written; raises ``ValueError`` when they do not split."""
        return split_preset_args(self.args)

    @property
    def args_effective(self) -> list[str]:
        """The arguments without the owned ones; none when they do not split (see ``args_error``)."""
        if self.args_error:
            return []
        return effective_args(Backend(self.model.backend), self.args_list)


def split_preset_args(args: str) -> list[str]:
    """``args`` split like a shell would (never run by one); ``ValueError`` says what is wrong."""
    if "\0" in args:
        raise ValueError("the arguments contain a NUL character")
    return shlex.split(args)


def preset_args_error(args: str) -> str:
    try:
        split_preset_args(args)
    except ValueError as exc:
        return f"cannot split the arguments like a shell would: {exc}"
    return ""


class ModelFile(models.Model):
    """A model file or folder a node worker found in its model folders (SLOTSERVE_MODEL_DIRS)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="model_files")
    path = models.CharField(max_length=1000)
    backend = models.CharField(max_length=20, choices=Backend.choices)
    size_bytes = models.BigIntegerField()
    modified = models.DateTimeField()
    seen_at = models.DateTimeField(default=timezone.now)
    # What memory estimates need, read on the node (GGUF metadata; config.json and safetensors
    # sizes), so a web host without the file can estimate too (placement.memory).
    shape = models.JSONField(null=True, blank=True)
    shape_error = models.TextField(blank=True)

    class Meta:
        ordering = ["node__name", "path"]
        constraints = [models.UniqueConstraint(fields=["node", "path"], name="model_file_unique_per_node")]

    def __str__(self) -> str:
        return f"{self.node}:{self.path}"


def validate_target(*, model: LLMModel | None, preset: Preset | None) -> None:
    """The one place of the rule that a preset belongs to its model."""
    if preset is not None and (model is None or preset.model_id != model.pk):
        owner = preset.model.name
        raise InvalidInput("preset", f"preset {preset.name!r} belongs to model {owner!r}, not to this model")
