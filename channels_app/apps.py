from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ChannelsAppConfig(AppConfig):
    name = "channels_app"
    verbose_name = "GPU channels"

    def ready(self) -> None:
        from channels_app.beat import register_tick

        post_migrate.connect(register_tick, sender=self, dispatch_uid="slotserve_register_tick")
