"""Forms the portal and the admin share, so that a rule is written once."""

from __future__ import annotations

from django import forms

from reservations.models import REJECT_REASON_MOST


class RejectForm(forms.Form):
    """Why an approver rejects a booking, the same in the portal and the admin."""

    reason = forms.CharField(
        max_length=REJECT_REASON_MOST,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="The booker reads this.",
    )
