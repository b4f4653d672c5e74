from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    verbose_name = "Reservations"

    def ready(self) -> None:
        # Registered in every process, so eager mode runs them where they are sent by name.
        # The node worker's news of a channel reaches the people it concerns.
        import reservations.channel_news
        import reservations.tasks  # noqa: F401
