"""pyqueue as a backend of Django's tasks (``pip install pyqueue-redis[django]``): Django's
``django.tasks`` (Django 6.0+), or the ``django-tasks`` backport on older Django, from
one backend::

    INSTALLED_APPS = [..., "pyqueue.contrib.django"]   # (and "django_tasks" for the backport)
    TASKS = {
        "default": {
            "BACKEND": "pyqueue.contrib.django.PyQueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"url": "redis://127.0.0.1:6379/0"},
        }
    }

``OPTIONS``: ``url`` (required: the Redis server producers and workers share; pyqueue's
URL grammar), ``prefix`` (pyqueue's key prefix, default ``"pq"``), ``on_commit`` (default
True: a task enqueued inside ``transaction.atomic()`` is sent when the transaction
commits, and not at all if it rolls back; False: at once), ``max_attempts`` (runs in
all, default 1: a task that raises is FAILED, as with Django's own backends),
``keep_result`` (seconds a run's result is kept for ``get_result``, default 86400),
``time_limit`` (seconds, default none). A wrong setting is reported by Django's system
checks (``manage.py check``: ``pyqueue.E001``..``E005``, ``W001``).

``python manage.py pyqueue_worker`` runs the tasks (every installed app's ``tasks``
module is imported first), each job between ``django.db.close_old_connections()``
calls, as Django does around a request. How tasks, results and errors map onto pyqueue
is in :mod:`pyqueue.contrib.django.backend`.
"""

from pyqueue.contrib.django.backend import PyQueueBackend

__all__ = ["PyQueueBackend"]
