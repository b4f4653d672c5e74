"""``manage.py apikey create USERNAME``: prints only the new key on stdout."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.api_keys import api_key_create


class Command(BaseCommand):
    help = "Create an API key for a user and print it (shown this once only)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key for USERNAME")
        create.add_argument("username")
        create.add_argument("--name", default="cli", help="a name to recognise the key by")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        user_model = get_user_model()
        try:
            user = user_model.objects.get(username=username)
        except user_model.DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        _, key = api_key_create(user=user, name=options["name"])
        self.stdout.write(key)
