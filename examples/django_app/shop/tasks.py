try:
    from django.tasks import task          # Django 6.0+
except ImportError:
    from django_tasks import task          # Django 5.x: pip install django-tasks

from shop.models import Order


@task(queue_name="emails")
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(id=order_id)   # the worker reads the committed order
    return f"receipt for order {order.id} sent to {order.email}: {order.total_cents / 100:.2f}"
