"""The reservation services: booking, approving, rejecting, cancelling and ending reservations
(docs/scheduling.md).

Every state change is a conditional ``UPDATE … WHERE status = …``: zero rows
means someone else changed the reservation first, and the caller is told
which state it is in now. Every change that can alter what a channel runs
re-decides that channel right after it commits. What a booking asks for is one value,
``NewBooking`` (a series adds its ``Repeat``).
"""

from __future__ import annotations

from reservations.services.asked import NewBooking as NewBooking
from reservations.services.booking import NoChannelFits as NoChannelFits
from reservations.services.booking import reservation_create as reservation_create
from reservations.services.booking import reservation_create_anywhere as reservation_create_anywhere
from reservations.services.changes import reservation_change as reservation_change
from reservations.services.changes import reservation_extend as reservation_extend
from reservations.services.changes import reservation_reschedule as reservation_reschedule
from reservations.services.common import START_GRACE as START_GRACE
from reservations.services.common import InvalidTransition as InvalidTransition
from reservations.services.common import ReservationConflict as ReservationConflict
from reservations.services.common import limits_of as limits_of
from reservations.services.common import needs_approval as needs_approval
from reservations.services.common import validate_slot as validate_slot
from reservations.services.series import Repeat as Repeat
from reservations.services.series import SeriesConflict as SeriesConflict
from reservations.services.series import reservation_series_cancel as reservation_series_cancel
from reservations.services.series import reservation_series_create as reservation_series_create
from reservations.services.series import series_preview as series_preview
from reservations.services.transitions import reservation_approve as reservation_approve
from reservations.services.transitions import reservation_cancel as reservation_cancel
from reservations.services.transitions import reservation_end as reservation_end
from reservations.services.transitions import reservation_reject as reservation_reject
from reservations.services.waitlist import waitlist_join as waitlist_join
from reservations.services.waitlist import waitlist_leave as waitlist_leave
