from django.apps import AppConfig


class PortalConfig(AppConfig):
    """The HTML portal: pages, forms and view models; the live overview's WebSocket."""

    name = "portal"
    verbose_name = "Portal"
