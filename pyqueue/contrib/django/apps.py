"""The Django app of :mod:`pyqueue.contrib.django`: ``INSTALLED_APPS`` names it for
``manage.py pyqueue_worker`` and for the system checks of the backend."""

from __future__ import annotations

from django.apps import AppConfig


class PyQueueConfig(AppConfig):  # type: ignore[misc]  # Django ships no types
    name = "pyqueue.contrib.django"
    label = "pyqueue"
    verbose_name = "pyqueue"

    def ready(self) -> None:
        # The task framework's system check (every backend's check()) is registered when
        # its checks module is imported: Django 6 imports it with django.tasks, the
        # backport only from its own app's ready(). Imported here so that a project that
        # lists this app but not django_tasks still has its TASKS checked.
        from pyqueue.contrib.django.backend import framework

        framework().checks  # noqa: B018
