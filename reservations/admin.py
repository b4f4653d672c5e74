from django.contrib import admin

from reservations.models import Notification, Reservation


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin[Reservation]):
    list_display = ["channel", "user", "start", "end", "model", "preset", "exclusive", "status"]
    list_filter = ["status", "exclusive", "channel"]
    search_fields = ["user__username", "note"]
    date_hierarchy = "start"
    raw_id_fields = ["user"]


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin[Notification]):
    list_display = ["user", "event", "created", "read"]
    list_filter = ["event", "read"]
    search_fields = ["user__username", "text"]
