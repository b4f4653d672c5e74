"""REST views for reservations and booking hints; a person's own profile, notifications and
waitlist are ``reservations.account_api``."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from channels_app.models import Channel, LLMModel, Preset
from reservations import hints, services
from reservations.filters import ReservationFilter
from reservations.models import REJECT_REASON_MOST, Reservation
from reservations.profiles import profile_for
from reservations.recurrence import DAY_NAMES, MAX_EVERY, MAX_OCCURRENCES, REPEATS
from reservations.selectors import reviewable_by
from reservations.wording import slot_words, zone_of
from slotserve_base.api_fields import IdOrNameField, MomentField, current_user, is_id, moment_param
from slotserve_base.iso import iso_moment


class ChannelOrAutoField(IdOrNameField):
    """A channel by id or name, or ``"auto"``: the best channel that fits (docs/scheduling.md)."""

    def to_internal_value(self, data: Any) -> Any:
        return None if data == "auto" else super().to_internal_value(data)


class ReservationInput(serializers.Serializer[Any]):
    channel = ChannelOrAutoField(queryset=Channel.objects.select_related("node"))
    start = MomentField()
    end = MomentField()
    model = IdOrNameField(queryset=LLMModel.objects.all(), required=False, allow_null=True)
    preset = serializers.PrimaryKeyRelatedField(
        queryset=Preset.objects.all(), required=False, allow_null=True
    )
    exclusive = serializers.BooleanField(required=False, default=False)
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    lend = serializers.BooleanField(
        required=False,
        default=False,
        help_text="let others call the booked model while you are idle, where the channel lends "
        "(docs/gateway.md, Lending)",
    )


class ReservationOutput(serializers.ModelSerializer[Reservation]):
    user = serializers.CharField(source="user.username")
    channel_name = serializers.CharField(source="channel.name")

    class Meta:
        model = Reservation
        fields = [
            "id",
            "user",
            "channel",
            "channel_name",
            "start",
            "end",
            "model",
            "preset",
            "exclusive",
            "lend",
            "status",
            "extends",
            "series",
            "idle_warned_at",
            "released_idle_at",
            "reject_reason",
            "note",
            "created",
            "requests",
            "prompt_tokens",
            "completion_tokens",
        ]


class ExtendInput(serializers.Serializer[Any]):
    end = MomentField()


class SeriesInput(ReservationInput):
    repeat = serializers.ChoiceField(choices=list(REPEATS))
    every = serializers.IntegerField(
        required=False,
        default=1,
        min_value=1,
        max_value=MAX_EVERY,
        help_text="every this many days, weeks or months",
    )
    on_days = serializers.MultipleChoiceField(
        choices=list(DAY_NAMES),
        required=False,
        default=set,
        help_text="a weekly series' days besides its first slot's: mon … sun",
    )
    until = serializers.DateField(
        required=False, allow_null=True, help_text="the last day (local), inclusive"
    )
    count = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_OCCURRENCES)
    time_zone = serializers.CharField(
        required=False, max_length=64, help_text="whose wall-clock times the series keeps; default: yours"
    )
    skip_conflicts = serializers.BooleanField(
        required=False,
        default=False,
        help_text="book the occurrences that can be, skipping the others (default: all or none)",
    )


class ChangeInput(serializers.Serializer[Any]):
    """What to change; what is left out stays. ``preset: null`` drops the preset."""

    start = MomentField(required=False)
    end = MomentField(required=False)
    model = IdOrNameField(queryset=LLMModel.objects.all(), required=False)
    preset = serializers.PrimaryKeyRelatedField(
        queryset=Preset.objects.all(), required=False, allow_null=True
    )
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000)
    lend = serializers.BooleanField(required=False, help_text="lent while you are idle (yours alone)")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError(
                {"start": "name what to change: start, end, model, preset, note or lend"}
            )
        return attrs


class RejectInput(serializers.Serializer[Any]):
    reason = serializers.CharField(allow_blank=False, max_length=REJECT_REASON_MOST)


class ReservationViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet[Reservation],
):
    """Users see their own reservations; staff see everyone's.

    Another user's reservation answers 404, not 403, so that ids cannot be
    probed.
    """

    serializer_class = ReservationOutput
    filterset_class = ReservationFilter

    def get_queryset(self) -> QuerySet[Reservation]:
        queryset = Reservation.objects.select_related("user", "channel")
        if not self.request.user.is_staff:
            queryset = queryset.filter(user=current_user(self.request))
        if self.action == "list":  # ?from=&to=: the bookings that overlap that window
            params = self.request.query_params
            if params.get("from"):
                queryset = queryset.filter(end__gt=moment_param(self.request, "from"))
            if params.get("to"):
                queryset = queryset.filter(start__lt=moment_param(self.request, "to"))
        return queryset.order_by("start", "pk")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = ReservationInput(data=request.data)
        data.is_valid(raise_exception=True)
        booking = services.NewBooking.of(current_user(request), data.validated_data)
        create = services.reservation_create if booking.channel else services.reservation_create_anywhere
        reservation = create(booking, now=timezone.now())
        return Response(ReservationOutput(reservation).data, status=status.HTTP_201_CREATED)

    def _to_decide(self, request: Request, pk: str | None) -> Reservation:
        """A reservation the caller may approve or reject (staff, or an approver of the booker's
        group); their own answers 403, anyone else's 404."""
        user = current_user(request)
        found = reviewable_by(user).filter(pk=pk).first() if pk and is_id(str(pk)) else None
        if found is None:
            if self.get_queryset().filter(pk=pk).exists() if pk and is_id(str(pk)) else False:
                raise PermissionDenied("only staff or an approver of the booker's group may decide this")
            raise NotFound("no such reservation")
        return found

    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        reservation = services.reservation_approve(
            reservation=self._to_decide(request, pk), by=current_user(request), now=timezone.now()
        )
        return Response(ReservationOutput(reservation).data)

    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        reservation_to_decide = self._to_decide(request, pk)
        data = RejectInput(data=request.data)
        data.is_valid(raise_exception=True)
        reservation = services.reservation_reject(
            reservation=reservation_to_decide,
            by=current_user(request),
            reason=data.validated_data["reason"],
            now=timezone.now(),
        )
        return Response(ReservationOutput(reservation).data)

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        reservation = services.reservation_cancel(
            reservation=self.get_object(), by=current_user(request), now=timezone.now()
        )
        return Response(ReservationOutput(reservation).data)

    @action(detail=True, methods=["post"])
    def end(self, request: Request, pk: str | None = None) -> Response:
        reservation = services.reservation_end(
            reservation=self.get_object(), by=current_user(request), now=timezone.now()
        )
        return Response(ReservationOutput(reservation).data)

    @action(detail=True, methods=["post"])
    def extend(self, request: Request, pk: str | None = None) -> Response:
        data = ExtendInput(data=request.data)
        data.is_valid(raise_exception=True)
        extended = self.get_object()
        holder = services.reservation_extend(
            reservation=extended, by=current_user(request), end=data.validated_data["end"], now=timezone.now()
        )
        # 202: the added time is a pending extension (its own reservation) that waits for approval.
        status = 202 if holder.pk != extended.pk else 200
        return Response(ReservationOutput(holder).data, status=status)

    @action(detail=False, methods=["post"])
    def series(self, request: Request) -> Response:
        """Book a recurring slot: every occurrence or none (409 lists each that cannot be); with
        ``skip_conflicts``, those that can be, and the skipped ones listed."""
        booking, repeat, fields = self._series_fields(request.data)
        series, made, skipped = services.reservation_series_create(
            booking, repeat, now=timezone.now(), skip_conflicts=fields.get("skip_conflicts", False)
        )
        return Response(
            {
                "series": series.pk,
                "reservations": ReservationOutput(made, many=True).data,
                "skipped": [
                    {"start": iso_moment(s), "end": iso_moment(e), "reason": why} for s, e, why in skipped
                ],
            },
            status=status.HTTP_201_CREATED,
        )

    @action(detail=False, methods=["get"], url_path="series-preview")
    def series_preview(self, request: Request) -> Response:
        """A series' occurrences as they would be booked now, each with why it cannot be (""
        when it can): the dialog's preview; nothing is booked."""
        booking, repeat, _ = self._series_fields(request.query_params)
        seen = services.series_preview(booking, repeat, now=timezone.now())
        zone = zone_of(current_user(request))
        return Response(
            {
                "occurrences": [
                    # ``words``: the slot in the caller's zone, named as every page names it.
                    {
                        "start": iso_moment(s),
                        "end": iso_moment(e),
                        "words": slot_words(s, e, zone),
                        "problem": why,
                    }
                    for s, e, why in seen
                ]
            }
        )

    def _series_fields(self, given: Any) -> tuple[services.NewBooking, services.Repeat, dict[str, Any]]:
        data = SeriesInput(data=given)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        if fields["channel"] is None:
            raise serializers.ValidationError({"channel": "a series is booked on one channel; name it"})
        user = current_user(self.request)
        repeat = services.Repeat(
            repeat=fields["repeat"],
            time_zone=fields.get("time_zone") or profile_for(user).time_zone,
            until=fields.get("until"),
            count=fields.get("count"),
            every=fields.get("every") or 1,
            on_days=tuple(sorted(DAY_NAMES.index(d) for d in fields.get("on_days") or ())),
        )
        return services.NewBooking.of(user, fields), repeat, fields

    @action(detail=False, methods=["post"], url_path=r"series/(?P<series_id>\d+)/cancel")
    def cancel_series(self, request: Request, series_id: str) -> Response:
        """Cancel every occurrence of a series that has not started."""
        from reservations.models import ReservationSeries

        found = ReservationSeries.objects.filter(pk=int(series_id))
        if not request.user.is_staff:
            found = found.filter(user=current_user(request))
        series = found.first()
        if series is None:
            raise NotFound("no such series of yours")
        cancelled = services.reservation_series_cancel(
            series=series, by=current_user(request), now=timezone.now()
        )
        return Response({"cancelled": [r.pk for r in cancelled]})

    @action(detail=True, methods=["post"])
    def change(self, request: Request, pk: str | None = None) -> Response:
        """Move, shorten or retarget a booking (the owner; staff for anyone)."""
        data = ChangeInput(data=request.data)
        data.is_valid(raise_exception=True)
        reservation = services.reservation_change(
            reservation=self.get_object(), by=current_user(request), now=timezone.now(), **data.validated_data
        )
        return Response(ReservationOutput(reservation).data)

    @action(detail=False, methods=["get"])
    def hints(self, request: Request) -> Response:
        params = request.query_params
        data = ReservationInput(
            data={
                "channel": params.get("channel"),
                "start": moment_param(request, "start"),
                "end": moment_param(request, "end"),
                "model": params.get("model") or None,
                "preset": params.get("preset") or None,
                "exclusive": params.get("exclusive", "false"),
            }
        )
        data.is_valid(raise_exception=True)
        user = current_user(request)
        fields = data.validated_data
        if fields["channel"] is None:
            raise serializers.ValidationError(
                {"channel": "hints are for one channel; use /api/placement to choose"}
            )
        fields.pop("lend", None)  # lending changes nothing a hint tells
        warnings = hints.booking_hints(user=user, now=timezone.now(), **fields)
        return Response({"warnings": warnings, "quota": hints.quota_hint(user=user, **fields)})
