from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    verbose_name = "Reservations"

    def ready(self) -> None:
        # Registered in every process, so eager mode runs them where they are sent by name.
        # The happenings people are told of (notifications).
        import reservations.consequences
        import reservations.notices
        import reservations.tasks  # noqa: F401
