from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "reservations.webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"

    def ready(self) -> None:
        # Every process listens: a happening is stored with the transaction that made it.
        import reservations.webhooks.listen
        import reservations.webhooks.tasks  # noqa: F401
