from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Gateway and API keys"

    def ready(self) -> None:
        # Registered in every process, so eager mode runs them where they are sent by name.
        import gateway.tasks  # noqa: F401
