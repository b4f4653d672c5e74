from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ChannelsAppConfig(AppConfig):
    name = "channels_app"
    verbose_name = "GPU channels"

    def ready(self) -> None:
        from django.conf import settings

        from channels_app.node_worker.gpus import FakeGpuSpecError, parse_fake_gpus
        from channels_app.scheduling.beat import register_tick
        from slotserve_base.env import SettingError

        if settings.SLOTSERVE_FAKE_GPUS:
            try:
                parse_fake_gpus(settings.SLOTSERVE_FAKE_GPUS)
            except FakeGpuSpecError as exc:
                raise SettingError(str(exc)) from None

        # The stages' tasks, registered in every process (slotserve_base.dispatch sends by name).
        import channels_app.node_worker.tasks
        import channels_app.scheduling.tasks  # noqa: F401
        from channels_app.story import on_happening
        from slotserve_base.happenings import Happening, happened

        happened.connect(on_happening, sender=Happening, dispatch_uid="channels_app.story.on_happening")
        from slotserve_base import news

        happened.connect(news.on_happening, sender=Happening, dispatch_uid="slotserve_base.news.on_happening")
        post_migrate.connect(register_tick, sender=self, dispatch_uid="slotserve_register_tick")
        # A channel's only allowed group is never deleted (a restriction never fails open).
        from django.contrib.auth.models import Group
        from django.db.models.signals import pre_delete

        from channels_app.inventory.groups import before_group_deleted

        pre_delete.connect(before_group_deleted, sender=Group, dispatch_uid="slotserve-group-deleted")
