from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from slotserve_site.celery import app as celery_app
from tests import factories


@pytest.fixture(autouse=True)
def _eager_celery():
    """Tasks run in-process unless a test starts a real worker on Redis."""
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


@pytest.fixture
def staff(db):
    return factories.user("admin", staff=True)


@pytest.fixture
def ana(db):
    return factories.user("ana")


@pytest.fixture
def bo(db):
    return factories.user("bo")


def _client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def staff_api(staff) -> APIClient:
    return _client_for(staff)


@pytest.fixture
def ana_api(ana) -> APIClient:
    return _client_for(ana)


@pytest.fixture
def bo_api(bo) -> APIClient:
    return _client_for(bo)


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    """Test users need no slow password hashing."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
