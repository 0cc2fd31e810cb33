from django.db import transaction
from django.http import JsonResponse

from shop.models import Order
from shop.tasks import send_receipt


def place_order(request):
    with transaction.atomic():
        order = Order.objects.create(email=request.POST["email"], total_cents=int(request.POST["total_cents"]))
        result = send_receipt.enqueue(order.id)     # sent when the transaction commits
        if order.total_cents <= 0:
            raise ValueError("an order costs something")   # rolled back: nothing is sent
    return JsonResponse({"order": order.id, "task": result.id})
