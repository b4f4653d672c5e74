from django.urls import path

from portal import account, booking, closures, people, playground, staff_actions, usage
from portal import actions as portal_actions
from portal import calendar as portal_calendar
from portal import views as portal
from portal import webhooks as portal_webhooks

app_name = "portal"

urlpatterns = [
    path("", portal.overview, name="overview"),
    path("calendar/", portal_calendar.calendar, name="calendar"),
    path("calendar/<str:token>.ics", account.calendar_feed, name="calendar_feed"),
    path("models/", portal.models_page, name="models"),
    path("models/files/<int:pk>/register", portal.register_model_file, name="register_model_file"),
    path("channel/<int:pk>/log", portal.run_log, name="run_log"),
    path("book/", booking.book, name="book"),
    path("reservations/", portal_actions.my_reservations, name="my_reservations"),
    path("reservations/<int:pk>/cancel", portal_actions.cancel, name="cancel"),
    path("reservations/<int:pk>/end", portal_actions.end, name="end"),
    path("reservations/<int:pk>/extend", portal_actions.extend, name="extend"),
    path("reservations/<int:pk>/change", portal_actions.change, name="change"),
    path("reservations/series/<int:pk>/cancel", portal_actions.cancel_series, name="cancel_series"),
    path("waitlist/<int:pk>/leave", portal_actions.leave_waitlist, name="leave_waitlist"),
    path("approvals/", staff_actions.approvals, name="approvals"),
    path("approvals/approve", staff_actions.approve_several, name="approve_several"),
    path("approvals/reject", staff_actions.reject_several, name="reject_several"),
    path("approvals/<int:pk>/approve", staff_actions.approve, name="approve"),
    path("approvals/<int:pk>/reject", staff_actions.reject, name="reject"),
    path("channel/<int:pk>/controls", portal.channel_controls, name="channel_controls"),
    path("channel/<int:pk>/override", staff_actions.channel_override, name="override"),
    path("channel/<int:pk>/reload", staff_actions.channel_reload_view, name="reload"),
    path("join/<str:token>", people.join, name="join"),
    path("signup/", people.signup, name="signup"),
    path("signup/confirm/<str:token>", people.confirm, name="signup_confirm"),
    path("people/", people.people, name="people"),
    path("people/<int:pk>/change", people.person_change, name="person_change"),
    path("people/signups/<int:pk>/decide", people.signup_decide, name="signup_decide"),
    path("closures/", closures.closures, name="closures"),
    path("closures/blackouts/<int:pk>/delete", closures.delete_blackout, name="delete_blackout"),
    path("closures/bulletins/<int:pk>/delete", closures.delete_bulletin, name="delete_bulletin"),
    path("notifications/", account.notifications, name="notifications"),
    path("settings/", account.preferences, name="preferences"),
    path("settings/time-zone", account.set_time_zone, name="set_time_zone"),
    path("keys/", account.keys, name="keys"),
    path("playground/", playground.playground, name="playground"),
    path("playground/key", playground.key, name="playground_key"),
    path("requests/", account.my_requests, name="requests"),
    path("usage/", usage.usage_page, name="usage"),
    path("usage/csv", usage.usage_csv, name="usage_csv"),
    path("keys/<int:pk>/revoke", account.revoke_key, name="revoke_key"),
    path("webhooks/", portal_webhooks.webhooks, name="webhooks"),
    path("webhooks/<int:pk>/test", portal_webhooks.test, name="webhook_test"),
    path("webhooks/<int:pk>/change", portal_webhooks.change, name="webhook_change"),
    path("webhooks/<int:pk>/pause", portal_webhooks.pause, name="webhook_pause"),
    path("webhooks/<int:pk>/new-secret", portal_webhooks.new_secret, name="webhook_new_secret"),
    path("webhooks/<int:pk>/delete", portal_webhooks.delete, name="webhook_delete"),
    path(
        "webhooks/<int:pk>/deliveries/<int:delivery_id>/redeliver",
        portal_webhooks.redeliver,
        name="webhook_redeliver",
    ),
]
