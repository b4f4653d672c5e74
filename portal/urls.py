from django.urls import path

from gateway.usage import views as usage_views
from portal import actions as portal_actions
from portal import views as portal

app_name = "portal"

urlpatterns = [
    path("", portal.overview, name="overview"),
    path("calendar/", portal.calendar, name="calendar"),
    path("calendar/<str:token>.ics", portal_actions.calendar_feed, name="calendar_feed"),
    path("models/", portal.models_page, name="models"),
    path("models/files/<int:pk>/register", portal.register_model_file, name="register_model_file"),
    path("channel/<int:pk>/log", portal.run_log, name="run_log"),
    path("book/", portal_actions.book, name="book"),
    path("reservations/", portal_actions.my_reservations, name="my_reservations"),
    path("reservations/<int:pk>/cancel", portal_actions.cancel, name="cancel"),
    path("reservations/<int:pk>/end", portal_actions.end, name="end"),
    path("reservations/<int:pk>/extend", portal_actions.extend, name="extend"),
    path("reservations/<int:pk>/change", portal_actions.change, name="change"),
    path("reservations/series/<int:pk>/cancel", portal_actions.cancel_series, name="cancel_series"),
    path("approvals/", portal_actions.approvals, name="approvals"),
    path("approvals/<int:pk>/approve", portal_actions.approve, name="approve"),
    path("approvals/<int:pk>/reject", portal_actions.reject, name="reject"),
    path("channel/<int:pk>/override", portal_actions.channel_override, name="override"),
    path("channel/<int:pk>/reload", portal_actions.channel_reload_view, name="reload"),
    path("notifications/", portal_actions.notifications, name="notifications"),
    path("settings/", portal_actions.preferences, name="preferences"),
    path("settings/time-zone", portal_actions.set_time_zone, name="set_time_zone"),
    path("keys/", portal_actions.keys, name="keys"),
    path("requests/", portal_actions.my_requests, name="requests"),
    path("usage/", usage_views.usage_page, name="usage"),
    path("usage/csv", usage_views.usage_csv, name="usage_csv"),
    path("keys/<int:pk>/revoke", portal_actions.revoke_key, name="revoke_key"),
]
